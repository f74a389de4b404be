//! The cache engine (lands with issue 2).
