//! Routing: which ingress operation a method and path name.

use http::Method;

/// An ingress operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET /service/health` (and `/restate/health`): the services callable here.
    Health,
    /// No operation matches.
    NotFound,
}

impl Route {
    /// The route of a request.
    pub fn of(method: &Method, path: &str) -> Self {
        let path = path.trim_end_matches('/');
        match (method, path) {
            (&Method::GET, "/service/health" | "/restate/health") => Route::Health,
            _ => Route::NotFound,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_under_both_prefixes() {
        assert_eq!(Route::of(&Method::GET, "/service/health"), Route::Health);
        assert_eq!(Route::of(&Method::GET, "/restate/health/"), Route::Health);
        assert_eq!(Route::of(&Method::POST, "/service/health"), Route::NotFound);
        assert_eq!(Route::of(&Method::GET, "/service/healthz"), Route::NotFound);
        assert_eq!(Route::of(&Method::GET, "/"), Route::NotFound);
    }
}
