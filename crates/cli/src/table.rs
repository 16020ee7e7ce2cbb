//! Plain aligned tables for human output.

/// Renders rows under a header, columns padded to their widest cell.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_owned() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// Prints `value` as indented JSON (what `--json` writes).
pub fn print_json(value: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn columns_align() {
        let out = super::render(
            &["ID", "NAME"],
            &[
                vec!["dp_1".into(), "Greeter".into()],
                vec!["x".into(), "y".into()],
            ],
        );
        assert_eq!(out, "ID    NAME\ndp_1  Greeter\nx     y\n");
    }
}
