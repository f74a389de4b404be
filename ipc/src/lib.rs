//! Placeholder until the ipc crate lands.
