//! Finds non-finite floats in any `Serialize` value before it becomes a
//! `serde_json::Value`, where NaN and infinities silently become `null`.

use std::fmt::{self, Write as _};

use serde::ser::{self, Serialize};

/// `Ok(Some(path))` names the first non-finite float (`.candidates[2].mse`);
/// `Err` is an error raised by the value's own `Serialize`.
pub(super) fn first_non_finite<T: Serialize + ?Sized>(value: &T) -> Result<Option<String>, String> {
    let mut walker = Walker {
        path: String::new(),
    };
    match value.serialize(&mut walker) {
        Ok(()) => Ok(None),
        Err(WalkError::NonFinite(path)) => Ok(Some(path)),
        Err(WalkError::Custom(reason)) => Err(reason),
    }
}

struct Walker {
    path: String,
}

impl Walker {
    fn float(&mut self, v: f64) -> Result<(), WalkError> {
        if v.is_finite() {
            Ok(())
        } else {
            Err(WalkError::NonFinite(self.path.clone()))
        }
    }

    fn nested<T: Serialize + ?Sized>(
        &mut self,
        segment: fmt::Arguments<'_>,
        value: &T,
    ) -> Result<(), WalkError> {
        let len = self.path.len();
        let _ = self.path.write_fmt(segment);
        let result = value.serialize(&mut *self);
        self.path.truncate(len);
        result
    }
}

#[derive(Debug)]
enum WalkError {
    NonFinite(String),
    Custom(String),
}

impl fmt::Display for WalkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WalkError::NonFinite(path) => write!(f, "non-finite number at {path}"),
            WalkError::Custom(reason) => f.write_str(reason),
        }
    }
}

impl std::error::Error for WalkError {}

impl ser::Error for WalkError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        WalkError::Custom(msg.to_string())
    }
}

/// Walks one sequence, map or struct. `restore` undoes the variant name
/// pushed onto the path for tuple and struct variants.
struct Compound<'a> {
    walker: &'a mut Walker,
    index: usize,
    key: String,
    restore: Option<usize>,
}

impl<'a> Compound<'a> {
    fn new(walker: &'a mut Walker, restore: Option<usize>) -> Self {
        Self {
            walker,
            index: 0,
            key: String::new(),
            restore,
        }
    }

    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), WalkError> {
        let i = self.index;
        self.index += 1;
        self.walker.nested(format_args!("[{i}]"), value)
    }

    fn field<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> Result<(), WalkError> {
        self.walker.nested(format_args!(".{key}"), value)
    }

    fn finish(self) -> Result<(), WalkError> {
        if let Some(len) = self.restore {
            self.walker.path.truncate(len);
        }
        Ok(())
    }
}

type Done = Result<(), WalkError>;

impl<'a> ser::Serializer for &'a mut Walker {
    type Ok = ();
    type Error = WalkError;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    fn serialize_bool(self, _: bool) -> Done {
        Ok(())
    }
    fn serialize_i8(self, _: i8) -> Done {
        Ok(())
    }
    fn serialize_i16(self, _: i16) -> Done {
        Ok(())
    }
    fn serialize_i32(self, _: i32) -> Done {
        Ok(())
    }
    fn serialize_i64(self, _: i64) -> Done {
        Ok(())
    }
    fn serialize_i128(self, _: i128) -> Done {
        Ok(())
    }
    fn serialize_u8(self, _: u8) -> Done {
        Ok(())
    }
    fn serialize_u16(self, _: u16) -> Done {
        Ok(())
    }
    fn serialize_u32(self, _: u32) -> Done {
        Ok(())
    }
    fn serialize_u64(self, _: u64) -> Done {
        Ok(())
    }
    fn serialize_u128(self, _: u128) -> Done {
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> Done {
        self.float(f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Done {
        self.float(v)
    }
    fn serialize_char(self, _: char) -> Done {
        Ok(())
    }
    fn serialize_str(self, _: &str) -> Done {
        Ok(())
    }
    fn serialize_bytes(self, _: &[u8]) -> Done {
        Ok(())
    }
    fn serialize_none(self) -> Done {
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Done {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Done {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Done {
        Ok(())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Done {
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Done {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Done {
        self.nested(format_args!(".{variant}"), value)
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Compound<'a>, WalkError> {
        Ok(Compound::new(self, None))
    }
    fn serialize_tuple(self, _: usize) -> Result<Compound<'a>, WalkError> {
        Ok(Compound::new(self, None))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Compound<'a>, WalkError> {
        Ok(Compound::new(self, None))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Compound<'a>, WalkError> {
        let len = self.path.len();
        let _ = write!(self.path, ".{variant}");
        Ok(Compound::new(self, Some(len)))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Compound<'a>, WalkError> {
        Ok(Compound::new(self, None))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Compound<'a>, WalkError> {
        Ok(Compound::new(self, None))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Compound<'a>, WalkError> {
        let len = self.path.len();
        let _ = write!(self.path, ".{variant}");
        Ok(Compound::new(self, Some(len)))
    }
}

impl ser::SerializeSeq for Compound<'_> {
    type Ok = ();
    type Error = WalkError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        self.element(value)
    }
    fn end(self) -> Done {
        self.finish()
    }
}

impl ser::SerializeTuple for Compound<'_> {
    type Ok = ();
    type Error = WalkError;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        self.element(value)
    }
    fn end(self) -> Done {
        self.finish()
    }
}

impl ser::SerializeTupleStruct for Compound<'_> {
    type Ok = ();
    type Error = WalkError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        self.element(value)
    }
    fn end(self) -> Done {
        self.finish()
    }
}

impl ser::SerializeTupleVariant for Compound<'_> {
    type Ok = ();
    type Error = WalkError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        self.element(value)
    }
    fn end(self) -> Done {
        self.finish()
    }
}

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = WalkError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Done {
        // Keys only name the path; a key JSON cannot hold is refused
        // later, when the evidence is converted.
        self.key = match serde_json::to_value(key) {
            Ok(serde_json::Value::String(s)) => s,
            Ok(other) => other.to_string(),
            Err(_) => "?".to_string(),
        };
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Done {
        let key = std::mem::take(&mut self.key);
        self.field(&key, value)
    }
    fn end(self) -> Done {
        self.finish()
    }
}

impl ser::SerializeStruct for Compound<'_> {
    type Ok = ();
    type Error = WalkError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Done {
        self.field(key, value)
    }
    fn end(self) -> Done {
        self.finish()
    }
}

impl ser::SerializeStructVariant for Compound<'_> {
    type Ok = ();
    type Error = WalkError;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Done {
        self.field(key, value)
    }
    fn end(self) -> Done {
        self.finish()
    }
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    use super::first_non_finite;

    #[derive(Serialize)]
    struct Candidate {
        name: &'static str,
        mse: f64,
        extra: Option<Vec<f32>>,
    }

    #[derive(Serialize)]
    enum Tagged {
        Struct { x: f64 },
        Tuple(f64, f64),
    }

    #[test]
    fn finite_walker_names_the_path() {
        let ok = vec![Candidate {
            name: "int8",
            mse: 0.5,
            extra: Some(vec![1.0]),
        }];
        assert_eq!(first_non_finite(&ok), Ok(None));

        let nan_in_struct = serde_json::json!(null);
        assert_eq!(first_non_finite(&nan_in_struct), Ok(None));

        let bad = std::collections::BTreeMap::from([(
            "candidates",
            vec![
                Candidate {
                    name: "a",
                    mse: 1.0,
                    extra: None,
                },
                Candidate {
                    name: "b",
                    mse: 2.0,
                    extra: Some(vec![0.0, f32::INFINITY]),
                },
            ],
        )]);
        assert_eq!(
            first_non_finite(&bad),
            Ok(Some(".candidates[1].extra[1]".to_string()))
        );
        assert_eq!(
            first_non_finite(&vec![Tagged::Struct { x: f64::NAN }]),
            Ok(Some("[0].Struct.x".to_string()))
        );
        assert_eq!(
            first_non_finite(&(1.0, Tagged::Tuple(0.0, f64::NEG_INFINITY))),
            Ok(Some("[1].Tuple[1]".to_string()))
        );
    }
}
