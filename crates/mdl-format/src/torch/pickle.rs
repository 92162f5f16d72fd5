//! A reader of the pickle opcodes `torch.save` writes, building an inert value tree: nothing is
//! imported, called or constructed. A global is only its name; a call (`REDUCE`, `NEWOBJ`) is
//! the callable's value and its arguments, kept for a caller to recognise. Any other opcode is
//! refused, as is input past the limits below.

use std::collections::HashMap;

use super::TorchError;

/// Index of a value in [`Pickle::values`].
pub(crate) type Id = usize;

/// A value of the object graph.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer wider than 64 bits (kept only as a marker).
    BigInt,
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Id>),
    List(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    Set(Vec<Id>),
    /// A global name (`module.qualname`), never resolved.
    Global(String),
    /// `callable(*args)`, later filled by `SETITEM`s, `APPEND`s or `BUILD`.
    Object {
        callable: Id,
        args: Id,
        items: Vec<(Id, Id)>,
        list: Vec<Id>,
        state: Option<Id>,
    },
    /// A persistent id (in torch archives: a storage reference).
    PersistentId(Id),
}

/// A parsed pickle: its values and the root.
pub(crate) struct Pickle {
    pub(crate) values: Vec<Value>,
    pub(crate) root: Id,
}

/// Most values a pickle may make, and most entries its stack may hold (a checkpoint's pickle
/// makes about ten values per tensor).
const MAX_VALUES: usize = 1 << 20;

enum Slot {
    Mark,
    Value(Id),
}

struct Machine<'a> {
    input: &'a [u8],
    at: usize,
    values: Vec<Value>,
    stack: Vec<Slot>,
    memo: HashMap<u32, Id>,
}

/// Parses `input`, refusing any opcode outside the set torch writes (protocols 2 to 5, binary
/// forms only).
pub(crate) fn parse(input: &[u8]) -> Result<Pickle, TorchError> {
    let mut m = Machine {
        input,
        at: 0,
        values: Vec::new(),
        stack: Vec::new(),
        memo: HashMap::new(),
    };
    loop {
        if m.stack.len() > MAX_VALUES {
            return Err(TorchError::Pickle("stack too deep".into()));
        }
        let at = m.at;
        let op = m.take(1)?[0];
        let unsupported = || TorchError::Opcode { op, at };
        match op {
            0x80 => {
                // PROTO
                let v = m.take(1)?[0];
                if !(2..=5).contains(&v) {
                    return Err(TorchError::Pickle(format!("protocol {v}")));
                }
            }
            0x95 => {
                m.take(8)?; // FRAME: a length hint only
            }
            b'.' => {
                let root = m.pop()?;
                return Ok(Pickle {
                    values: m.values,
                    root,
                });
            }
            b'(' => m.stack.push(Slot::Mark),
            b'0' => {
                m.stack.pop().ok_or_else(|| m.underflow())?;
            }
            b'1' => {
                m.pop_mark()?;
            }
            b'2' => {
                let top = m.top()?;
                m.stack.push(Slot::Value(top));
            }
            b'N' => m.push(Value::None)?,
            0x88 => m.push(Value::Bool(true))?,
            0x89 => m.push(Value::Bool(false))?,
            b'J' => {
                let v = i32::from_le_bytes(m.take(4)?.try_into().unwrap());
                m.push(Value::Int(v.into()))?
            }
            b'K' => {
                let v = m.take(1)?[0];
                m.push(Value::Int(v.into()))?
            }
            b'M' => {
                let v = u16::from_le_bytes(m.take(2)?.try_into().unwrap());
                m.push(Value::Int(v.into()))?
            }
            0x8a | 0x8b => {
                // LONG1, LONG4: little-endian two's complement
                let n = if op == 0x8a {
                    m.take(1)?[0] as usize
                } else {
                    m.len4()?
                };
                let bytes = m.take(n)?;
                let v = if n <= 8 {
                    let fill = if bytes.last().is_some_and(|b| b & 0x80 != 0) {
                        0xff
                    } else {
                        0
                    };
                    let mut w = [fill; 8];
                    w[..n].copy_from_slice(bytes);
                    Value::Int(i64::from_le_bytes(w))
                } else {
                    Value::BigInt
                };
                m.push(v)?
            }
            b'G' => {
                let v = f64::from_be_bytes(m.take(8)?.try_into().unwrap());
                m.push(Value::Float(v))?
            }
            b'X' | 0x8c | 0x8d => {
                let n = match op {
                    b'X' => m.len4()?,
                    0x8c => m.take(1)?[0] as usize,
                    _ => m.len8()?,
                };
                let s = std::str::from_utf8(m.take(n)?)
                    .map_err(|_| TorchError::Pickle("a string is not UTF-8".into()))?
                    .to_string();
                m.push(Value::Str(s))?
            }
            b'U' | b'T' | b'C' | b'B' | 0x8e | 0x96 => {
                // Byte strings: SHORT_BINSTRING, BINSTRING, SHORT_BINBYTES, BINBYTES,
                // BINBYTES8, BYTEARRAY8.
                let n = match op {
                    b'U' | b'C' => m.take(1)?[0] as usize,
                    b'T' | b'B' => m.len4()?,
                    _ => m.len8()?,
                };
                let b = m.take(n)?.to_vec();
                m.push(Value::Bytes(b))?
            }
            b')' => m.push(Value::Tuple(Vec::new()))?,
            b']' => m.push(Value::List(Vec::new()))?,
            b'}' => m.push(Value::Dict(Vec::new()))?,
            0x8f => m.push(Value::Set(Vec::new()))?,
            b't' => {
                let items = m.pop_mark()?;
                m.push(Value::Tuple(items))?
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if m.stack.len() < n {
                    return Err(m.underflow());
                }
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(m.pop()?);
                }
                items.reverse();
                m.push(Value::Tuple(items))?
            }
            b'a' => {
                let v = m.pop()?;
                let list = m.top()?;
                m.append(list, vec![v])?;
            }
            b'e' => {
                let items = m.pop_mark()?;
                let list = m.top()?;
                m.append(list, items)?;
            }
            0x90 => {
                // ADDITEMS
                let items = m.pop_mark()?;
                let set = m.top()?;
                match &mut m.values[set] {
                    Value::Set(s) => s.extend(items),
                    _ => return Err(TorchError::Pickle("ADDITEMS to a non-set".into())),
                }
            }
            b's' => {
                let v = m.pop()?;
                let k = m.pop()?;
                let dict = m.top()?;
                m.set_items(dict, vec![(k, v)])?;
            }
            b'u' => {
                let items = m.pop_mark()?;
                if items.len() % 2 != 0 {
                    return Err(TorchError::Pickle("SETITEMS with an odd count".into()));
                }
                let pairs = items.chunks_exact(2).map(|c| (c[0], c[1])).collect();
                let dict = m.top()?;
                m.set_items(dict, pairs)?;
            }
            b'c' => {
                let module = m.line()?;
                let name = m.line()?;
                m.push(Value::Global(format!("{module}.{name}")))?
            }
            0x93 => {
                // STACK_GLOBAL
                let name = m.pop()?;
                let module = m.pop()?;
                let (Value::Str(module), Value::Str(name)) = (&m.values[module], &m.values[name])
                else {
                    return Err(TorchError::Pickle("STACK_GLOBAL of non-strings".into()));
                };
                let g = format!("{module}.{name}");
                m.push(Value::Global(g))?
            }
            b'R' | 0x81 => {
                // REDUCE, NEWOBJ
                let args = m.pop()?;
                let callable = m.pop()?;
                m.push(Value::Object {
                    callable,
                    args,
                    items: Vec::new(),
                    list: Vec::new(),
                    state: None,
                })?
            }
            b'b' => {
                let state = m.pop()?;
                let obj = m.top()?;
                match &mut m.values[obj] {
                    Value::Object { state: s, .. } => *s = Some(state),
                    _ => return Err(TorchError::Pickle("BUILD on a non-object".into())),
                }
            }
            b'Q' => {
                let pid = m.pop()?;
                m.push(Value::PersistentId(pid))?
            }
            b'q' | b'r' => {
                let key = if op == b'q' {
                    m.take(1)?[0] as u32
                } else {
                    m.len4()? as u32
                };
                let top = m.top()?;
                m.memo.insert(key, top);
            }
            0x94 => {
                // MEMOIZE
                let key = m.memo.len() as u32;
                let top = m.top()?;
                m.memo.insert(key, top);
            }
            b'h' | b'j' => {
                let key = if op == b'h' {
                    m.take(1)?[0] as u32
                } else {
                    m.len4()? as u32
                };
                let id = *m
                    .memo
                    .get(&key)
                    .ok_or_else(|| TorchError::Pickle(format!("memo key {key} unset")))?;
                m.stack.push(Slot::Value(id));
            }
            _ => return Err(unsupported()),
        }
    }
}

impl Machine<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], TorchError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.input.len())
            .ok_or_else(|| TorchError::Pickle("truncated".into()))?;
        let b = &self.input[self.at..end];
        self.at = end;
        Ok(b)
    }
    fn len4(&mut self) -> Result<usize, TorchError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()) as usize)
    }
    fn len8(&mut self) -> Result<usize, TorchError> {
        let n = u64::from_le_bytes(self.take(8)?.try_into().unwrap());
        usize::try_from(n).map_err(|_| TorchError::Pickle("truncated".into()))
    }
    fn line(&mut self) -> Result<String, TorchError> {
        let rest = &self.input[self.at..];
        let n = rest
            .iter()
            .take(1024)
            .position(|&b| b == b'\n')
            .ok_or_else(|| TorchError::Pickle("a global's name has no end".into()))?;
        let s = std::str::from_utf8(&rest[..n])
            .map_err(|_| TorchError::Pickle("a global's name is not UTF-8".into()))?
            .to_string();
        self.at += n + 1;
        Ok(s)
    }
    fn underflow(&self) -> TorchError {
        TorchError::Pickle(format!("stack underflow at byte {}", self.at))
    }
    fn push(&mut self, v: Value) -> Result<(), TorchError> {
        if self.values.len() >= MAX_VALUES {
            return Err(TorchError::Pickle("too many values".into()));
        }
        self.values.push(v);
        self.stack.push(Slot::Value(self.values.len() - 1));
        Ok(())
    }
    fn pop(&mut self) -> Result<Id, TorchError> {
        match self.stack.pop() {
            Some(Slot::Value(id)) => Ok(id),
            Some(Slot::Mark) => Err(TorchError::Pickle("unexpected mark".into())),
            None => Err(self.underflow()),
        }
    }
    fn top(&self) -> Result<Id, TorchError> {
        match self.stack.last() {
            Some(Slot::Value(id)) => Ok(*id),
            Some(Slot::Mark) => Err(TorchError::Pickle("unexpected mark".into())),
            None => Err(self.underflow()),
        }
    }
    /// The values above the topmost mark, in order; the mark is removed.
    fn pop_mark(&mut self) -> Result<Vec<Id>, TorchError> {
        let mark = self
            .stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .ok_or_else(|| TorchError::Pickle("no mark".into()))?;
        let items = self
            .stack
            .drain(mark + 1..)
            .map(|s| match s {
                Slot::Value(id) => id,
                Slot::Mark => unreachable!("the topmost mark"),
            })
            .collect();
        self.stack.pop();
        Ok(items)
    }
    fn append(&mut self, target: Id, items: Vec<Id>) -> Result<(), TorchError> {
        match &mut self.values[target] {
            Value::List(l) | Value::Object { list: l, .. } => {
                l.extend(items);
                Ok(())
            }
            _ => Err(TorchError::Pickle("APPEND to a non-list".into())),
        }
    }
    fn set_items(&mut self, target: Id, pairs: Vec<(Id, Id)>) -> Result<(), TorchError> {
        match &mut self.values[target] {
            Value::Dict(d) | Value::Object { items: d, .. } => {
                d.extend(pairs);
                Ok(())
            }
            _ => Err(TorchError::Pickle("SETITEM on a non-dict".into())),
        }
    }
}
