//! loom models of the cross-process protocols; see `tests/`.
