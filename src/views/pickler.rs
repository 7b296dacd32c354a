//! A streaming writer for plain-data pickles (protocol 2): dicts, lists, tuples, ints, floats,
//! strings, booleans and None, the shapes a PyTorch memory snapshot is made of.
//!
//! Why not serde-pickle: it is a dev-dependency here only, and a snapshot of a long trace is
//! hundreds of thousands of small dicts; writing opcodes as the values come avoids building a
//! value tree first. The opcodes are the ones both Python's unpickler and pytorch.org/memory_viz's
//! JavaScript unpickler read (PROTO 2, EMPTY_LIST/DICT with MARK ... APPENDS/SETITEMS in batches of
//! 1,000 as Python writes them, BININT*, LONG1, BINUNICODE, BINFLOAT, NEWTRUE/NEWFALSE, NONE,
//! TUPLE2, STOP); no memo, so nothing is shared and nothing can dangle.

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const MARK: u8 = b'(';
const EMPTY_LIST: u8 = b']';
const EMPTY_DICT: u8 = b'}';
const APPENDS: u8 = b'e';
const SETITEMS: u8 = b'u';
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const BINUNICODE: u8 = b'X';
const BINFLOAT: u8 = b'G';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const NONE: u8 = b'N';
const TUPLE2: u8 = 0x86;

/// Items per APPENDS / SETITEMS batch, as CPython's pickler writes them.
const BATCH: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    List,
    Dict,
}

/// Writes one pickle. Values are written in order; containers are opened with
/// [`Writer::begin_list`] / [`Writer::begin_dict`] and closed with [`Writer::end`]. In a dict,
/// values alternate key, value.
#[derive(Debug)]
pub struct Writer {
    out: Vec<u8>,
    /// Open containers with the number of values written since their last MARK.
    open: Vec<(Open, usize)>,
}

impl Default for Writer {
    fn default() -> Self {
        Writer::new()
    }
}

impl Writer {
    /// A new pickle (protocol 2 header written).
    pub fn new() -> Writer {
        Writer { out: vec![PROTO, 2], open: Vec::new() }
    }

    /// One value was completed at the current level: batch the container's items.
    fn done(&mut self) {
        if let Some((kind, n)) = self.open.last_mut() {
            *n += 1;
            let per_batch = match kind {
                Open::List => BATCH,
                Open::Dict => 2 * BATCH,
            };
            if *n == per_batch {
                *n = 0;
                self.out.push(if *kind == Open::List { APPENDS } else { SETITEMS });
                self.out.push(MARK);
            }
        }
    }

    /// `None`.
    pub fn none(&mut self) {
        self.out.push(NONE);
        self.done();
    }

    /// A boolean.
    pub fn bool(&mut self, b: bool) {
        self.out.push(if b { NEWTRUE } else { NEWFALSE });
        self.done();
    }

    /// An integer (any i128; LONG1 past the 32-bit range).
    pub fn int(&mut self, v: i128) {
        if (0..=0xff).contains(&v) {
            self.out.extend_from_slice(&[BININT1, v as u8]);
        } else if (0..=0xffff).contains(&v) {
            self.out.push(BININT2);
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else if i128::from(i32::MIN) <= v && v <= i128::from(i32::MAX) {
            self.out.push(BININT);
            self.out.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            // Little-endian two's complement, shortest form whose sign bit is right.
            let bytes = v.to_le_bytes();
            let mut n = 16;
            while n > 1 {
                let top = bytes[n - 1];
                let below_sign = bytes[n - 2] & 0x80 != 0;
                if (top == 0 && !below_sign) || (top == 0xff && below_sign) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend_from_slice(&[LONG1, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
        self.done();
    }

    /// An unsigned integer.
    pub fn uint(&mut self, v: u64) {
        self.int(i128::from(v));
    }

    /// A float.
    pub fn float(&mut self, v: f64) {
        self.out.push(BINFLOAT);
        self.out.extend_from_slice(&v.to_be_bytes());
        self.done();
    }

    /// A str.
    pub fn str(&mut self, s: &str) {
        self.out.push(BINUNICODE);
        self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
        self.done();
    }

    /// A 2-tuple of integers.
    pub fn tuple2_uint(&mut self, a: u64, b: u64) {
        // Written as two items of an implicit container: suspend batching for them.
        self.open.push((Open::List, 0));
        self.uint(a);
        self.uint(b);
        self.open.pop();
        self.out.push(TUPLE2);
        self.done();
    }

    /// Opens a list; its items follow.
    pub fn begin_list(&mut self) {
        self.out.extend_from_slice(&[EMPTY_LIST, MARK]);
        self.open.push((Open::List, 0));
    }

    /// Opens a dict; keys and values follow, alternating.
    pub fn begin_dict(&mut self) {
        self.out.extend_from_slice(&[EMPTY_DICT, MARK]);
        self.open.push((Open::Dict, 0));
    }

    /// Closes the innermost open container.
    pub fn end(&mut self) {
        if let Some((kind, _)) = self.open.pop() {
            self.out.push(if kind == Open::List { APPENDS } else { SETITEMS });
            self.done();
        }
    }

    /// A `str` key followed by an unsigned integer value.
    pub fn kv_uint(&mut self, k: &str, v: u64) {
        self.str(k);
        self.uint(v);
    }

    /// A `str` key followed by a `str` value.
    pub fn kv_str(&mut self, k: &str, v: &str) {
        self.str(k);
        self.str(v);
    }

    /// Closes what is open and returns the pickle's bytes.
    pub fn finish(mut self) -> Vec<u8> {
        while !self.open.is_empty() {
            self.end();
        }
        self.out.push(STOP);
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_pickle::{DeOptions, HashableValue, Value};

    fn read(b: &[u8]) -> Value {
        serde_pickle::value_from_slice(b, DeOptions::new()).expect("valid pickle")
    }

    #[test]
    fn ints_of_every_width_round_trip() {
        for v in [
            0i128,
            1,
            255,
            256,
            65535,
            65536,
            -1,
            -129,
            i32::MAX as i128,
            i32::MIN as i128,
            1 << 31,
            0x7f3d_7e00_0000,
            -(1 << 40),
            i64::MAX as i128,
            u64::MAX as i128,
        ] {
            let mut w = Writer::new();
            w.int(v);
            let got = read(&w.finish());
            let want = if let Ok(i) = i64::try_from(v) { Value::I64(i) } else { Value::Int(v.into()) };
            assert_eq!(got, want, "{v}");
        }
    }

    #[test]
    fn big_lists_and_dicts_are_batched_and_nest() {
        let mut w = Writer::new();
        w.begin_dict();
        w.str("xs");
        w.begin_list();
        for i in 0..2500u64 {
            w.uint(i);
        }
        w.end();
        w.str("t");
        w.tuple2_uint(0, 7);
        w.str("f");
        w.float(0.5);
        w.str("b");
        w.bool(true);
        w.str("n");
        w.none();
        w.end();
        let v = read(&w.finish());
        let Value::Dict(d) = v else { panic!("not a dict") };
        let Some(Value::List(xs)) = d.get(&HashableValue::String("xs".into())) else { panic!("no xs") };
        assert_eq!(xs.len(), 2500);
        assert_eq!(xs[2499], Value::I64(2499));
        assert_eq!(d.get(&HashableValue::String("t".into())), Some(&Value::Tuple(vec![Value::I64(0), Value::I64(7)])));
        assert_eq!(d.get(&HashableValue::String("f".into())), Some(&Value::F64(0.5)));
        assert_eq!(d.get(&HashableValue::String("n".into())), Some(&Value::None));
        let mut w = Writer::new();
        w.begin_dict();
        for i in 0..1500u64 {
            w.str(&format!("k{i}"));
            w.uint(i);
        }
        let Value::Dict(d) = read(&w.finish()) else { panic!("not a dict") };
        assert_eq!(d.len(), 1500);
    }
}
