//! `radixd exec`'s JSON lines (`radixd::exec`) from a client that may
//! send anything: every non-blank line gets one answer line, a JSON object
//! with `"ok"` (a refusal names a known error kind and says why); no
//! panic; the engine (and the store, when on) keep every invariant; and a
//! request the line parser accepts crosses the wire unchanged when the
//! wire takes it.
//!
//! Input: one control byte (which components, whether a store sits
//! beside the engine), then the lines.

#![no_main]

use libfuzzer_sys::fuzz_target;
use radixd::engine::{Components, Config, Engine, HeapRegion, MambaConfig, SwaConfig};
use radixd::exec;
use radixd::op::{ErrorKind, Local, Spare, WithStore};
use radixd::store::{HeapStore, StoreConfig};
use radixd::wire;
use serde_json::Value;

const PAGE_SIZE: u32 = 2;
const CAPACITY: u32 = 64;

fuzz_target!(|data: &[u8]| {
    let Some((&control, input)) = data.split_first() else {
        return;
    };
    let components = match control & 3 {
        0 | 3 => Components::full(),
        1 => Components {
            swa: Some(SwaConfig {
                window: 4,
                capacity: CAPACITY,
            }),
            mamba: None,
        },
        _ => Components {
            swa: None,
            mamba: Some(MambaConfig { capacity: 8 }),
        },
    };
    let config = Config {
        page_size: PAGE_SIZE,
        capacity: CAPACITY,
    };
    let engine = Engine::with_components(config, components).expect("a valid configuration");
    let local = Local {
        engine,
        client: 0,
        session_ttl: None,
    };
    let mut out = Vec::new();
    if control & 4 != 0 {
        let store_config = StoreConfig::for_size(1 << 20, 1).expect("a valid store size");
        let store = HeapStore::new(store_config).expect("a valid store");
        let mut backend = WithStore {
            inner: local,
            store,
        };
        exec::run(&mut backend, input, &mut out).expect("writing to a Vec");
        if let Err(e) = backend.store.index.validate() {
            panic!("store invariant broken: {e}");
        }
        check_engine(&backend.inner.engine);
    } else {
        let mut backend = local;
        exec::run(&mut backend, input, &mut out).expect("writing to a Vec");
        check_engine(&backend.engine);
    }
    check_answers(input, &out, &components);
});

fn check_engine(engine: &Engine<HeapRegion>) {
    if let Err(e) = engine.validate() {
        panic!("engine invariant broken: {e}");
    }
}

/// One answer line per non-blank request line, each a JSON object with
/// `"ok"`; each refusal a known error kind with a message. Lines the parser
/// accepts cross the wire unchanged, when the wire takes them.
fn check_answers(input: &[u8], out: &[u8], components: &Components) {
    let requests: Vec<&[u8]> = input
        .split_inclusive(|&b| b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        .collect();
    let answers: Vec<&[u8]> = out
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(requests.len(), answers.len(), "one answer per request line");
    let mut spare = Spare::default();
    for (line, answer) in requests.iter().zip(&answers) {
        let Ok(Value::Object(a)) = serde_json::from_slice::<Value>(answer) else {
            panic!(
                "answer {:?} is not a JSON object",
                String::from_utf8_lossy(answer)
            );
        };
        match a.get("ok") {
            Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => {
                let kind = a.get("error").and_then(Value::as_str);
                assert!(
                    ErrorKind::ALL.iter().any(|k| Some(k.name()) == kind),
                    "unknown error kind in {a:?}"
                );
                assert!(
                    matches!(a.get("message"), Some(Value::String(m)) if !m.is_empty()),
                    "a refusal without a reason: {a:?}"
                );
            }
            _ => panic!("answer without \"ok\": {a:?}"),
        }
        if let Ok(request) = exec::parse_for(line, components) {
            let e = wire::encode_request(&request, PAGE_SIZE, CAPACITY);
            let payload = e.payload();
            if let Ok(back) = wire::decode_request(&e.record, payload.as_slice(), &mut spare) {
                assert_eq!(back, request, "exec's request changed on the wire");
            }
        }
    }
}
