//! A small pickle virtual machine for plain data (protocols 0 to 5): `None`, bools, ints,
//! floats, strings, bytes, tuples, lists, dicts and sets, which is all a memory snapshot holds.
//!
//! Why not `serde-pickle`: its 1.2 `Value` decoder reference-counts memo entries and drops them
//! too early when a memoized container is shared (birkenfeld/serde-pickle PR #24): it rejects
//! `pickle.dumps({'a': [f, f]})` with "recursive structure found", and PyTorch shares frame dicts
//! between trace entries, so every snapshot with stack frames fails. It also clones memo entries
//! (a small hostile file can expand without bound) and converts and drops values recursively (a
//! deeply nested file overflows the stack).
//!
//! Here containers live in one arena and values refer to them by index, as Python objects refer
//! to each other: memo gets and `DUP` copy an index, never a tree; nothing recurses, so depth
//! costs nothing; work and memory are linear in the input. Every error carries the byte offset of
//! the opcode that failed. Class instances, persistent ids and out-of-band buffers are refused:
//! a snapshot never holds them.

use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

/// A decoded value. Containers are indices into [`Pickle::containers`].
///
/// Sixteen bytes (checked below): a list of 10^7 items costs 16 bytes an item, not the 32 an
/// `i128` payload or a fat `Rc<str>` would make it. Integers are the 64-bit ones every address,
/// size and id is (`Int` holds i64's range, `UInt` the values from 2^63 to 2^64 - 1); wider ones
/// keep only their size.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PV {
    None,
    Bool(bool),
    /// An integer in i64's range.
    Int(i64),
    /// An integer from 2^63 to 2^64 - 1 (an unsigned address or size above i64's range).
    UInt(u64),
    /// An integer beyond 64 bits; only its size is kept.
    HugeInt {
        bytes: usize,
    },
    Float(f64),
    Str(Text),
    Bytes(usize),
    Container(u32),
    /// A module global not (yet) applied by REDUCE.
    Global(Text),
}

/// A decoded string: a thin pointer, shared by memo gets.
pub(crate) type Text = Rc<String>;

const _: () = assert!(std::mem::size_of::<PV>() == 16);

impl PV {
    /// An integer value: `Int`, `UInt`, or past 64 bits `HugeInt`.
    pub fn from_int(n: i128) -> PV {
        if let Ok(i) = i64::try_from(n) {
            PV::Int(i)
        } else if let Ok(u) = u64::try_from(n) {
            PV::UInt(u)
        } else {
            // Its size in two's complement, as LONG1 would write it.
            let magnitude = if n < 0 { !n } else { n };
            PV::HugeInt { bytes: (129 - magnitude.leading_zeros() as usize).div_ceil(8) }
        }
    }
}

/// A [`Text`] of `s`.
fn text(s: &str) -> Text {
    Rc::new(s.to_owned())
}

/// What kind of container an arena slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    List,
    Tuple,
    /// Items are stored flat: key, value, key, value.
    Dict,
    Set,
    FrozenSet,
}

/// One container: its kind, items, and the byte offset of the opcode that created it.
#[derive(Debug)]
pub(crate) struct Container {
    pub kind: Kind,
    /// Items taken out by the consumer of a streamed decode ([`decode_streamed`]): a hollowed
    /// list keeps only their count.
    pub hollowed: u32,
    /// The consumer refused one of its values: it is offered no more.
    pub refused: bool,
    pub items: Vec<PV>,
    pub offset: u64,
}

const _: () = assert!(std::mem::size_of::<Container>() == 40);

impl Container {
    /// Its number of items, those hollowed out included.
    pub fn len(&self) -> usize {
        self.items.len() + self.hollowed as usize
    }
}

/// The consumer of a streamed decode: offered each value appended to a list (the list's arena
/// index, the value's index in it), it takes the values it can turn into its own compact form
/// (a snapshot's trace entries) and returns true; the VM then drops the value's items and hollows
/// the lists it holds (keeping their lengths), so that a long list of dicts is never held whole.
/// A list stops being offered values once one is refused, so that the taken ones are always a
/// prefix of the list.
pub(crate) type Consumer<'c> = dyn FnMut(&[Container], u32, usize, &PV) -> bool + 'c;

/// A decoded pickle: the arena and the root value.
#[derive(Debug)]
pub(crate) struct Pickle {
    pub containers: Vec<Container>,
    pub root: PV,
    /// Bytes after the STOP opcode (ignored, as Python's `pickle.loads` ignores them).
    pub trailing: usize,
    /// Bytes of the pickle.
    pub input_len: usize,
}

/// Why a pickle could not be decoded, and where.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PickleError {
    pub offset: u64,
    pub truncated: bool,
    pub message: String,
}

impl fmt::Display for PickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
impl Pickle {
    /// The container `pv` refers to, if it is one.
    pub fn container(&self, pv: &PV) -> Option<&Container> {
        match pv {
            PV::Container(i) => self.containers.get(*i as usize),
            _ => None,
        }
    }
}

/// Memo: dense ids (what `MEMOIZE` and CPython's pickler produce) in a vector, others in a map.
#[derive(Default)]
struct Memo {
    dense: Vec<Option<PV>>,
    sparse: HashMap<u32, PV>,
    len: usize,
}

impl Memo {
    fn put(&mut self, id: u32, v: PV) {
        let i = id as usize;
        if i < self.dense.len() {
            if self.dense[i].is_none() {
                self.len += 1;
            }
            self.dense[i] = Some(v);
        } else if i == self.dense.len() && self.sparse.is_empty() {
            self.dense.push(Some(v));
            self.len += 1;
        } else if self.sparse.insert(id, v).is_none() {
            self.len += 1;
        }
    }

    fn get(&self, id: u32) -> Option<&PV> {
        match self.dense.get(id as usize) {
            Some(slot) => slot.as_ref(),
            None => self.sparse.get(&id),
        }
    }
}

mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const FLOAT: u8 = b'F';
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const LONG: u8 = b'L';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const PERSID: u8 = b'P';
    pub const BINPERSID: u8 = b'Q';
    pub const REDUCE: u8 = b'R';
    pub const STRING: u8 = b'S';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const BUILD: u8 = b'b';
    pub const GLOBAL: u8 = b'c';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const INST: u8 = b'i';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const OBJ: u8 = b'o';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINFLOAT: u8 = b'G';
    pub const PROTO: u8 = 0x80;
    pub const NEWOBJ: u8 = 0x81;
    pub const EXT1: u8 = 0x82;
    pub const EXT2: u8 = 0x83;
    pub const EXT4: u8 = 0x84;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const EMPTY_SET: u8 = 0x8f;
    pub const ADDITEMS: u8 = 0x90;
    pub const FROZENSET: u8 = 0x91;
    pub const NEWOBJ_EX: u8 = 0x92;
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
    pub const BYTEARRAY8: u8 = 0x96;
    pub const NEXT_BUFFER: u8 = 0x97;
    pub const READONLY_BUFFER: u8 = 0x98;
}

/// Decodes one pickle from `data`.
#[cfg(test)]
pub(crate) fn decode(data: &[u8]) -> Result<Pickle, PickleError> {
    decode_streamed(data, &mut |_, _, _, _| false, &mut |_| {})
}

/// Decodes one pickle from `data`, offering every value appended to a list to `consume`, and
/// telling `behind` every few MiB how far it has read (the bytes before it are never read again:
/// a mapped file gives their pages back).
pub(crate) fn decode_streamed(data: &[u8], consume: &mut Consumer<'_>, behind: &mut dyn FnMut(usize)) -> Result<Pickle, PickleError> {
    let vm = Vm {
        data,
        pos: 0,
        op_at: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Memo::default(),
        containers: Vec::new(),
        consume,
        behind,
        next_behind: BEHIND_EVERY,
    };
    vm.run()
}

/// How often (in bytes read) the VM says how far it has read.
const BEHIND_EVERY: usize = 4 << 20;

struct Vm<'a, 'c> {
    data: &'a [u8],
    pos: usize,
    /// Offset of the opcode being executed, for errors.
    op_at: usize,
    stack: Vec<PV>,
    /// Stack heights at each MARK.
    marks: Vec<usize>,
    memo: Memo,
    containers: Vec<Container>,
    consume: &'c mut Consumer<'c>,
    behind: &'c mut dyn FnMut(usize),
    next_behind: usize,
}

type R<T> = Result<T, PickleError>;

impl<'a> Vm<'a, '_> {
    fn fail<T>(&self, message: impl Into<String>) -> R<T> {
        Err(PickleError { offset: self.op_at as u64, truncated: false, message: message.into() })
    }

    fn truncated<T>(&self) -> R<T> {
        Err(PickleError {
            offset: self.data.len() as u64,
            truncated: true,
            message: "the data ends before the pickle's STOP opcode".into(),
        })
    }

    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        let data: &'a [u8] = self.data;
        match self.pos.checked_add(n).and_then(|end| data.get(self.pos..end)) {
            Some(s) => {
                self.pos += n;
                Ok(s)
            }
            None => self.truncated(),
        }
    }

    fn byte(&mut self) -> R<u8> {
        Ok(self.take(1)?[0])
    }

    fn le_u32(&mut self) -> R<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn le_i32(&mut self) -> R<i32> {
        let b = self.take(4)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A signed 4-byte length (BINSTRING, LONG4), refused when negative.
    fn le_len(&mut self) -> R<u64> {
        let n = self.le_i32()?;
        match u64::try_from(n) {
            Ok(n) => Ok(n),
            Err(_) => self.fail("negative length"),
        }
    }

    fn le_u64(&mut self) -> R<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A newline-terminated argument, without the newline (and a `\r` before it).
    fn line(&mut self) -> R<&'a [u8]> {
        let data: &'a [u8] = self.data;
        let rest = data.get(self.pos..).unwrap_or(&[]);
        match rest.iter().position(|&b| b == b'\n') {
            Some(n) => {
                self.pos += n + 1;
                let l = &rest[..n];
                Ok(l.strip_suffix(b"\r").unwrap_or(l))
            }
            None => self.truncated(),
        }
    }

    /// `n` bytes whose count was read from the stream: refused before allocating when the input
    /// cannot hold them.
    fn counted(&mut self, n: u64) -> R<&'a [u8]> {
        match usize::try_from(n) {
            Ok(n) => self.take(n),
            Err(_) => self.truncated(),
        }
    }

    fn utf8(&self, b: &[u8]) -> R<PV> {
        match std::str::from_utf8(b) {
            Ok(s) => Ok(PV::Str(text(s))),
            Err(e) => self.fail(format!("string is not valid UTF-8 ({e})")),
        }
    }

    fn pop(&mut self) -> R<PV> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.fail("stack underflow");
        }
        match self.stack.pop() {
            Some(v) => Ok(v),
            None => self.fail("stack underflow"),
        }
    }

    fn top(&self) -> R<&PV> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.fail("stack underflow");
        }
        match self.stack.last() {
            Some(v) => Ok(v),
            None => self.fail("stack underflow"),
        }
    }

    fn pop_mark(&mut self) -> R<Vec<PV>> {
        match self.marks.pop() {
            Some(h) if h <= self.stack.len() => {
                if 2 * h >= self.stack.len() {
                    return Ok(self.stack.split_off(h));
                }
                // A long run of items (a list of 10^7 of them): they become the container's items
                // where they lie, the few values under the mark move to a new stack, so that the
                // run is never held twice; the run's spare capacity is given back.
                let mut items = std::mem::take(&mut self.stack);
                self.stack = items.drain(..h).collect();
                if items.capacity() > items.len() + items.len() / 8 + 1024 {
                    items.shrink_to_fit();
                }
                Ok(items)
            }
            _ => self.fail("no MARK on the stack"),
        }
    }

    fn new_container(&mut self, kind: Kind, items: Vec<PV>) -> R<PV> {
        let Ok(i) = u32::try_from(self.containers.len()) else {
            return self.fail("more than 2^32 containers");
        };
        self.containers.push(Container { kind, hollowed: 0, refused: false, items, offset: self.op_at as u64 });
        Ok(PV::Container(i))
    }

    /// Adds `items` to the container on top of the stack, which must be of a kind `ok` accepts.
    fn extend_top(&mut self, items: Vec<PV>, what: &str, ok: fn(Kind) -> bool) -> R<()> {
        let target = match self.top()? {
            PV::Container(i) => *i as usize,
            _ => return self.fail(format!("{what} on something that is not a container")),
        };
        let fail = |vm: &Self| vm.fail::<()>(format!("{what} on the wrong kind of container"));
        let mut items = items;
        if self.containers.get(target).is_some_and(|c| c.kind == Kind::List) {
            items = self.offer(target as u32, items);
        }
        match self.containers.get_mut(target) {
            Some(c) if ok(c.kind) => {
                if c.kind == Kind::Dict && items.len() & 1 == 1 {
                    return self.fail("odd number of items for a dict");
                }
                if c.items.is_empty() {
                    c.items = items;
                } else {
                    c.items.extend(items);
                }
                Ok(())
            }
            _ => fail(self),
        }
    }

    /// Offers `items`, about to be appended to list `list`, to the consumer; returns those it
    /// did not take (a suffix: once it refuses one, the list is refused for good).
    fn offer(&mut self, list: u32, mut items: Vec<PV>) -> Vec<PV> {
        let Some(start) = self.containers.get(list as usize).filter(|c| !c.refused).map(|c| c.len()) else { return items };
        let mut taken = 0;
        for (k, item) in items.iter().enumerate() {
            if !(self.consume)(&self.containers, list, start + k, item) {
                if let Some(c) = self.containers.get_mut(list as usize) {
                    c.refused = true;
                }
                break;
            }
            taken += 1;
        }
        if taken == 0 {
            return items;
        }
        for item in &items[..taken] {
            self.hollow(item);
        }
        if let Some(c) = self.containers.get_mut(list as usize) {
            c.hollowed = c.hollowed.saturating_add(taken as u32);
        }
        items.drain(..taken);
        items
    }

    /// Drops a taken value's items, and the items of the lists it holds (their lengths kept).
    fn hollow(&mut self, item: &PV) {
        let PV::Container(d) = item else { return };
        let Some(c) = self.containers.get_mut(*d as usize) else { return };
        let items = std::mem::take(&mut c.items);
        for v in &items {
            if let PV::Container(l) = v {
                if let Some(inner) = self.containers.get_mut(*l as usize).filter(|c| matches!(c.kind, Kind::List | Kind::Tuple)) {
                    let n = inner.items.len();
                    inner.hollowed = inner.hollowed.saturating_add(n as u32);
                    inner.items = Vec::new();
                }
            }
        }
    }

    fn int_text(&self, line: &[u8], long: bool) -> R<PV> {
        let text = std::str::from_utf8(line).unwrap_or("").trim();
        if !long {
            match text {
                "00" => return Ok(PV::Bool(false)),
                "01" => return Ok(PV::Bool(true)),
                _ => {}
            }
        }
        let digits = text.strip_suffix('L').unwrap_or(text);
        match digits.parse::<i128>() {
            Ok(n) => Ok(PV::from_int(n)),
            Err(_) if !digits.is_empty() && digits.trim_start_matches(['-', '+']).bytes().all(|b| b.is_ascii_digit()) => {
                Ok(PV::HugeInt { bytes: digits.len() / 2 })
            }
            Err(_) => self.fail(format!("invalid integer literal {:?}", String::from_utf8_lossy(line))),
        }
    }

    /// A little-endian two's-complement integer (LONG1 / LONG4).
    fn int_binary(b: &[u8]) -> PV {
        if b.len() > 16 {
            return PV::HugeInt { bytes: b.len() };
        }
        if b.is_empty() {
            return PV::Int(0);
        }
        let negative = b[b.len() - 1] & 0x80 != 0;
        let mut buf = if negative { [0xffu8; 16] } else { [0u8; 16] };
        buf[..b.len()].copy_from_slice(b);
        PV::from_int(i128::from_le_bytes(buf))
    }

    fn run(mut self) -> R<Pickle> {
        loop {
            self.op_at = self.pos;
            if self.pos >= self.next_behind {
                (self.behind)(self.pos);
                self.next_behind = self.pos + BEHIND_EVERY;
            }
            let code = self.byte()?;
            match code {
                op::PROTO => {
                    let v = self.byte()?;
                    if v > 5 {
                        return self.fail(format!("unsupported pickle protocol {v}"));
                    }
                }
                op::FRAME => {
                    self.le_u64()?;
                }
                op::STOP => {
                    let root = self.pop()?;
                    let trailing = self.data.len().saturating_sub(self.pos);
                    return Ok(Pickle { containers: self.containers, root, trailing, input_len: self.data.len() });
                }
                op::MARK => self.marks.push(self.stack.len()),
                op::POP => {
                    let floor = self.marks.last().copied().unwrap_or(0);
                    if self.stack.len() > floor {
                        self.pop()?;
                    } else {
                        self.pop_mark()?;
                    }
                }
                op::POP_MARK => {
                    self.pop_mark()?;
                }
                op::DUP => {
                    let v = self.top()?.clone();
                    self.stack.push(v);
                }

                op::PUT => {
                    let line = self.line()?;
                    let Some(id) = std::str::from_utf8(line).ok().and_then(|s| s.trim().parse::<u32>().ok()) else {
                        return self.fail("invalid memo id");
                    };
                    let v = self.top()?.clone();
                    self.memo.put(id, v);
                }
                op::BINPUT => {
                    let id = u32::from(self.byte()?);
                    let v = self.top()?.clone();
                    self.memo.put(id, v);
                }
                op::LONG_BINPUT => {
                    let id = self.le_u32()?;
                    let v = self.top()?.clone();
                    self.memo.put(id, v);
                }
                op::MEMOIZE => {
                    let Ok(id) = u32::try_from(self.memo.len) else {
                        return self.fail("memo full");
                    };
                    let v = self.top()?.clone();
                    self.memo.put(id, v);
                }
                op::GET | op::BINGET | op::LONG_BINGET => {
                    let id = match code {
                        op::GET => {
                            let line = self.line()?;
                            match std::str::from_utf8(line).ok().and_then(|s| s.trim().parse::<u32>().ok()) {
                                Some(id) => id,
                                None => return self.fail("invalid memo id"),
                            }
                        }
                        op::BINGET => u32::from(self.byte()?),
                        _ => self.le_u32()?,
                    };
                    match self.memo.get(id) {
                        Some(v) => {
                            let v = v.clone();
                            self.stack.push(v);
                        }
                        None => return self.fail(format!("memo id {id} was never stored")),
                    }
                }

                op::NONE => self.stack.push(PV::None),
                op::NEWTRUE => self.stack.push(PV::Bool(true)),
                op::NEWFALSE => self.stack.push(PV::Bool(false)),
                op::INT | op::LONG => {
                    let line = self.line()?;
                    let v = self.int_text(line, code == op::LONG)?;
                    self.stack.push(v);
                }
                op::FLOAT => {
                    let line = self.line()?;
                    match std::str::from_utf8(line).ok().and_then(|s| s.trim().parse::<f64>().ok()) {
                        Some(x) => self.stack.push(PV::Float(x)),
                        None => return self.fail("invalid float literal"),
                    }
                }
                op::BININT => {
                    let n = self.le_i32()?;
                    self.stack.push(PV::Int(i64::from(n)));
                }
                op::BININT1 => {
                    let n = self.byte()?;
                    self.stack.push(PV::Int(i64::from(n)));
                }
                op::BININT2 => {
                    let b = self.take(2)?;
                    self.stack.push(PV::Int(i64::from(u16::from_le_bytes([b[0], b[1]]))));
                }
                op::LONG1 => {
                    let n = u64::from(self.byte()?);
                    let b = self.counted(n)?;
                    self.stack.push(Self::int_binary(b));
                }
                op::LONG4 => {
                    let n = self.le_len()?;
                    let b = self.counted(n)?;
                    self.stack.push(Self::int_binary(b));
                }
                op::BINFLOAT => {
                    let b = self.take(8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(b);
                    self.stack.push(PV::Float(f64::from_be_bytes(a)));
                }

                op::STRING => {
                    let line = self.line()?;
                    let v = self.quoted_string(line)?;
                    self.stack.push(v);
                }
                op::BINSTRING | op::SHORT_BINSTRING => {
                    let n = if code == op::SHORT_BINSTRING { u64::from(self.byte()?) } else { self.le_len()? };
                    let b = self.counted(n)?;
                    // Python 2 str: Python 3 decodes it as ASCII by default; be lenient.
                    self.stack.push(PV::Str(text(&String::from_utf8_lossy(b))));
                }
                op::UNICODE => {
                    let line = self.line()?;
                    let v = self.raw_unicode_escape(line)?;
                    self.stack.push(v);
                }
                op::SHORT_BINUNICODE | op::BINUNICODE | op::BINUNICODE8 => {
                    let n = match code {
                        op::SHORT_BINUNICODE => u64::from(self.byte()?),
                        op::BINUNICODE => u64::from(self.le_u32()?),
                        _ => self.le_u64()?,
                    };
                    let b = self.counted(n)?;
                    let v = self.utf8(b)?;
                    self.stack.push(v);
                }
                op::SHORT_BINBYTES | op::BINBYTES | op::BINBYTES8 | op::BYTEARRAY8 => {
                    let n = match code {
                        op::SHORT_BINBYTES => u64::from(self.byte()?),
                        op::BINBYTES => u64::from(self.le_u32()?),
                        _ => self.le_u64()?,
                    };
                    let b = self.counted(n)?;
                    self.stack.push(PV::Bytes(b.len()));
                }

                op::EMPTY_TUPLE => {
                    let v = self.new_container(Kind::Tuple, Vec::new())?;
                    self.stack.push(v);
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let n = usize::from(code - op::TUPLE1 + 1);
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    let v = self.new_container(Kind::Tuple, items)?;
                    self.stack.push(v);
                }
                op::TUPLE | op::LIST | op::DICT | op::FROZENSET => {
                    let items = self.pop_mark()?;
                    let kind = match code {
                        op::TUPLE => Kind::Tuple,
                        op::LIST => Kind::List,
                        op::DICT => Kind::Dict,
                        _ => Kind::FrozenSet,
                    };
                    if kind == Kind::Dict && items.len() & 1 == 1 {
                        return self.fail("odd number of items for a dict");
                    }
                    let v = self.new_container(kind, items)?;
                    self.stack.push(v);
                }
                op::EMPTY_LIST | op::EMPTY_DICT | op::EMPTY_SET => {
                    let kind = match code {
                        op::EMPTY_LIST => Kind::List,
                        op::EMPTY_DICT => Kind::Dict,
                        _ => Kind::Set,
                    };
                    let v = self.new_container(kind, Vec::new())?;
                    self.stack.push(v);
                }
                op::APPEND => {
                    let v = self.pop()?;
                    self.extend_top(vec![v], "APPEND", |k| k == Kind::List)?;
                }
                op::APPENDS => {
                    let items = self.pop_mark()?;
                    self.extend_top(items, "APPENDS", |k| k == Kind::List)?;
                }
                op::SETITEM => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.extend_top(vec![k, v], "SETITEM", |k| k == Kind::Dict)?;
                }
                op::SETITEMS => {
                    let items = self.pop_mark()?;
                    self.extend_top(items, "SETITEMS", |k| k == Kind::Dict)?;
                }
                op::ADDITEMS => {
                    let items = self.pop_mark()?;
                    self.extend_top(items, "ADDITEMS", |k| k == Kind::Set)?;
                }

                op::GLOBAL => {
                    let module = String::from_utf8_lossy(self.line()?).into_owned();
                    let name = String::from_utf8_lossy(self.line()?).into_owned();
                    self.stack.push(PV::Global(Rc::new(format!("{module}.{name}"))));
                }
                op::STACK_GLOBAL => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (PV::Str(m), PV::Str(n)) => self.stack.push(PV::Global(Rc::new(format!("{m}.{n}")))),
                        _ => return self.fail("STACK_GLOBAL needs two strings"),
                    }
                }
                op::REDUCE => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let v = self.reduce(callable, args)?;
                    self.stack.push(v);
                }

                op::INST | op::OBJ | op::NEWOBJ | op::NEWOBJ_EX | op::BUILD => {
                    return self
                        .fail(format!("opcode {:?} builds a class instance; a memory snapshot holds plain dicts and lists", code as char))
                }
                op::PERSID | op::BINPERSID | op::EXT1 | op::EXT2 | op::EXT4 | op::NEXT_BUFFER | op::READONLY_BUFFER => {
                    return self
                        .fail(format!("opcode 0x{code:02x} (persistent ids, extension registry or out-of-band buffers) is not supported"))
                }
                other => return self.fail(format!("unknown opcode 0x{other:02x}")),
            }
        }
    }

    /// The few callables plain data needs in protocols before 4 (sets, bytes, bytearrays).
    fn reduce(&mut self, callable: PV, args: PV) -> R<PV> {
        let PV::Global(name) = callable else {
            return self.fail("REDUCE of something that is not a global");
        };
        let first = match &args {
            PV::Container(i) => self.containers.get(*i as usize).filter(|c| c.kind == Kind::Tuple).map(|c| c.items.first().cloned()),
            _ => None,
        };
        let Some(first) = first else {
            return self.fail("REDUCE arguments are not a tuple");
        };
        match name.as_str() {
            "builtins.set" | "__builtin__.set" | "builtins.frozenset" | "__builtin__.frozenset" => {
                let kind = if name.ends_with("frozenset") { Kind::FrozenSet } else { Kind::Set };
                let items = match first.as_ref().and_then(|f| match f {
                    PV::Container(i) => self.containers.get(*i as usize),
                    _ => None,
                }) {
                    Some(c) if c.kind == Kind::List || c.kind == Kind::Tuple => c.items.clone(),
                    _ if first.is_none() => Vec::new(),
                    _ => return self.fail(format!("{name}() of something that is not a list")),
                };
                self.new_container(kind, items)
            }
            "builtins.bytearray" | "__builtin__.bytearray" | "_codecs.encode" => Ok(match first {
                Some(PV::Str(s)) => PV::Bytes(s.chars().count()),
                Some(PV::Bytes(n)) => PV::Bytes(n),
                _ => PV::Bytes(0),
            }),
            _ => self.fail(format!("unsupported global {name}: this pickle holds Python objects, not a memory snapshot's plain data")),
        }
    }

    /// Protocol 0 `STRING`: a Python 2 `repr` of a byte string, quotes included.
    fn quoted_string(&self, line: &[u8]) -> R<PV> {
        let inner = match line {
            [q, inner @ .., e] if (*q == b'\'' || *q == b'"') && q == e => inner,
            _ => return self.fail("STRING argument is not quoted"),
        };
        let mut out = Vec::with_capacity(inner.len());
        let mut i = 0;
        while i < inner.len() {
            let c = inner[i];
            if c != b'\\' || i + 1 == inner.len() {
                out.push(c);
                i += 1;
                continue;
            }
            let e = inner[i + 1];
            i += 2;
            match e {
                b'n' => out.push(b'\n'),
                b't' => out.push(b'\t'),
                b'r' => out.push(b'\r'),
                b'0'..=b'7' => {
                    let mut v = u32::from(e - b'0');
                    let mut k = 0;
                    while k < 2 && i < inner.len() && (b'0'..=b'7').contains(&inner[i]) {
                        v = v * 8 + u32::from(inner[i] - b'0');
                        i += 1;
                        k += 1;
                    }
                    out.push((v & 0xff) as u8);
                }
                b'x' => {
                    let hex = inner.get(i..i + 2).and_then(|h| std::str::from_utf8(h).ok());
                    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                        Some(v) => {
                            out.push(v);
                            i += 2;
                        }
                        None => return self.fail("invalid \\x escape in STRING"),
                    }
                }
                other => out.push(other),
            }
        }
        Ok(PV::Str(text(&String::from_utf8_lossy(&out))))
    }

    /// Protocol 0 `UNICODE`: raw-unicode-escape (`\uXXXX`, `\UXXXXXXXX`, other bytes latin-1).
    fn raw_unicode_escape(&self, line: &[u8]) -> R<PV> {
        let mut out = String::with_capacity(line.len());
        let mut i = 0;
        while i < line.len() {
            let c = line[i];
            if c == b'\\' && i + 1 < line.len() && (line[i + 1] == b'u' || line[i + 1] == b'U') {
                let n = if line[i + 1] == b'u' { 4 } else { 8 };
                let hex = line.get(i + 2..i + 2 + n).and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u32::from_str_radix(h, 16).ok()).and_then(char::from_u32) {
                    Some(ch) => {
                        out.push(ch);
                        i += 2 + n;
                    }
                    None => return self.fail("invalid \\u escape in UNICODE"),
                }
            } else {
                out.push(char::from(c));
                i += 1;
            }
        }
        Ok(PV::Str(Rc::new(out)))
    }
}

/// A protocol-4 pickle of `depth` empty lists nested in one another (`]` pushes a list, `a`
/// appends the top into the one below): how deep a pickle may go without costing stack.
#[cfg(test)]
pub(super) fn nested_lists(depth: usize) -> Vec<u8> {
    let mut p = vec![0x80, 4];
    p.extend(vec![b']'; depth]);
    p.extend(vec![b'a'; depth - 1]);
    p.push(b'.');
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(b: &[u8]) -> Result<Pickle, PickleError> {
        decode(b)
    }

    #[test]
    fn shared_memoized_containers_decode_as_shared() {
        // pickle.dumps({'a': [f, f]}, protocol=4) with f = {'name': 'x'}: serde-pickle 1.2 fails
        // here with "recursive structure found".
        let p = b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94]\x94(}\x94\x8c\x04name\x94\x8c\x01x\x94sh\x03es.";
        let pk = dec(p).expect("decode");
        let top = pk.container(&pk.root).expect("dict");
        assert_eq!(top.kind, Kind::Dict);
        let list = pk.container(&top.items[1]).expect("list");
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.items[0], list.items[1], "both elements are the same dict");
        let f = pk.container(&list.items[0]).expect("dict");
        assert_eq!(f.items, vec![PV::Str(text("name")), PV::Str(text("x"))]);
    }

    #[test]
    fn protocol_0_text_opcodes() {
        // pickle.dumps({'a': [1, 2**70, -3, 1.5, True, None, 'é', 'z']}, protocol=0)
        let p = b"(dp0\nVa\np1\n(lp2\nI1\naL1180591620717411303424L\naI-3\naF1.5\naI01\naNaV\xe9\np3\naVz\np4\nas.";
        let pk = dec(p).expect("decode");
        let top = pk.container(&pk.root).expect("dict");
        let list = pk.container(&top.items[1]).expect("list");
        assert_eq!(list.items[0], PV::Int(1));
        assert_eq!(list.items[1], PV::HugeInt { bytes: 9 });
        assert_eq!(list.items[2], PV::Int(-3));
        assert_eq!(list.items[3], PV::Float(1.5));
        assert_eq!(list.items[4], PV::Bool(true));
        assert_eq!(list.items[5], PV::None);
        assert_eq!(list.items[6], PV::Str(text("é")));
    }

    #[test]
    fn protocol_2_sets_and_bytes_via_reduce_and_protocol_5_sets() {
        // pickle.dumps({'s': {1, 2}, 'b': b'ab', 't': (1,)}, protocol=2), then protocol=5
        let p2 = b"\x80\x02}q\x00(X\x01\x00\x00\x00sq\x01c__builtin__\nset\nq\x02]q\x03(K\x01K\x02e\x85q\x04Rq\x05X\x01\x00\x00\x00bq\x06c_codecs\nencode\nq\x07X\x02\x00\x00\x00abq\x08X\x06\x00\x00\x00latin1q\t\x86q\nRq\x0bX\x01\x00\x00\x00tq\x0cK\x01\x85q\ru.";
        let p5 = b"\x80\x05\x95\"\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01s\x94\x8f\x94(K\x01K\x02\x90\x8c\x01b\x94C\x02ab\x94\x8c\x01t\x94K\x01\x85\x94u.";
        for p in [&p2[..], &p5[..]] {
            let pk = dec(p).expect("decode");
            let top = pk.container(&pk.root).expect("dict");
            assert_eq!(top.items.len(), 6);
            let set = pk.container(&top.items[1]).expect("set");
            assert_eq!((set.kind, set.items.clone()), (Kind::Set, vec![PV::Int(1), PV::Int(2)]));
            assert_eq!(top.items[3], PV::Bytes(2));
            assert_eq!(pk.container(&top.items[5]).map(|c| c.kind), Some(Kind::Tuple));
        }
    }

    #[test]
    fn binary_longs_are_twos_complement() {
        assert_eq!(Vm::int_binary(&[0xff]), PV::Int(-1));
        assert_eq!(Vm::int_binary(&[0x00, 0x80]), PV::Int(-32768));
        assert_eq!(Vm::int_binary(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00]), PV::UInt(u64::MAX));
        assert_eq!(Vm::int_binary(&[0, 0, 0, 0, 0, 0, 0, 0x80]), PV::Int(i64::MIN));
        assert_eq!(Vm::int_binary(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff]), PV::HugeInt { bytes: 9 });
        assert_eq!(Vm::int_binary(&[1; 17]), PV::HugeInt { bytes: 17 });
    }

    #[test]
    fn errors_carry_offsets_and_never_allocate_counts_blindly() {
        let e = dec(b"\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\x7f").expect_err("huge count");
        assert!(e.truncated);
        let e = dec(b"\x80\x04N\xffN.").expect_err("bad opcode");
        assert_eq!((e.offset, e.truncated), (3, false));
        assert!(e.message.contains("0xff"), "{}", e.message);
        let e = dec(b"\x80\x04a.").expect_err("underflow");
        assert_eq!(e.offset, 2);
        let e = dec(b"\x80\x04h\x05.").expect_err("missing memo");
        assert!(e.message.contains("memo id 5"), "{}", e.message);
        let e = dec(b"").expect_err("empty");
        assert!(e.truncated);
    }

    #[test]
    fn a_list_of_ten_million_items_is_held_once_at_sixteen_bytes_an_item() {
        // `](` N×10^7 `e.`: the items of one APPENDS run become the list's items where they lie
        // (before: 32 bytes a value, held on the stack, in the run and in the list, 64 a value at
        // the peak).
        let n = 10_000_000;
        let mut p = vec![0x80, 4, b']', b'('];
        p.extend(std::iter::repeat_n(b'N', n));
        p.extend_from_slice(b"e.");
        let pk = dec(&p).expect("decode");
        let list = pk.container(&pk.root).expect("list");
        assert_eq!(list.items.len(), n);
        let bytes = list.items.capacity() * std::mem::size_of::<PV>();
        assert!(bytes <= n * 16 + n * 2 + 1024 * 16, "{n} items held in {bytes} bytes ({:.1} a value)", bytes as f64 / n as f64);
        // Ints are the same size (no i128 payload), and a run after other values keeps them.
        let mut p = vec![0x80, 4, b'N', b']', b'('];
        for i in 0..1000u32 {
            p.push(b'J');
            p.extend_from_slice(&i.to_le_bytes());
        }
        p.extend_from_slice(b"e.");
        let pk = dec(&p).expect("decode");
        let list = pk.container(&pk.root).expect("list");
        assert_eq!(list.items.len(), 1000);
        assert_eq!(list.items[999], PV::Int(999));
    }

    #[test]
    fn integers_keep_their_64_bit_values() {
        assert_eq!(PV::from_int(-1), PV::Int(-1));
        assert_eq!(PV::from_int(i128::from(u64::MAX)), PV::UInt(u64::MAX));
        assert_eq!(PV::from_int(1 << 63), PV::UInt(1 << 63));
        assert_eq!(PV::from_int(1 << 70), PV::HugeInt { bytes: 9 });
        assert_eq!(PV::from_int(i128::from(i64::MIN) - 1), PV::HugeInt { bytes: 9 });
    }

    #[test]
    fn a_million_nested_lists_cost_no_stack() {
        let depth = 1_000_000;
        let pk = dec(&nested_lists(depth)).expect("decode");
        assert_eq!(pk.containers.len(), depth);
    }
}
