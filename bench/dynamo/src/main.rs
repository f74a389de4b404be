fn main() { let _ = dynamo_kv_router::RadixTree::new(); }
