//! goose v3.30 and the generated `migrate` on one `goose_db_version` (to be written).
