//! Partition log records (cluster mode) from Kafka never panic the reader, and what decodes
//! encodes back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_store::storage::record::Record;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = Record::decode(data, 1 << 20) {
        assert_eq!(record.encode(), data);
    }
});
