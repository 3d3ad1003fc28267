//! Typed values from JSON the way the OpenAPI document describes them.
//!
//! serde's derived structs also accept a sequence of their fields' values
//! in order (`"resources": [2, 8]`, a body of `[]` for a struct whose
//! fields all have defaults), and `serde_json::Value`'s deserializer hands
//! them one. The document says every such field is an object, so a client
//! writing an array is refused here, at any depth: [`from_value`] reads a
//! `Value` as serde_json does, except that a struct (or a struct variant)
//! is only ever read from an object.

use serde::de::{
    self, DeserializeSeed, EnumAccess, Error as _, IntoDeserializer, MapAccess, SeqAccess,
    Unexpected, VariantAccess, Visitor,
};
use serde::forward_to_deserialize_any;
use serde_json::{Error, Map, Value};

/// Reads `T` from `value`; a struct only from an object.
pub fn from_value<'de, T: de::Deserialize<'de>>(value: &'de Value) -> Result<T, Error> {
    T::deserialize(Strict(value))
}

/// A `Value` as a deserializer that refuses a sequence for a struct.
#[derive(Clone, Copy)]
pub struct Strict<'de>(pub &'de Value);

fn unexpected(value: &Value) -> Unexpected<'_> {
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Unexpected::Unsigned(u),
            (_, Some(i), _) => Unexpected::Signed(i),
            (_, _, Some(f)) => Unexpected::Float(f),
            _ => Unexpected::Other("number"),
        },
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

impl<'de> de::Deserializer<'de> for Strict<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => n.deserialize_any(visitor),
            Value::String(s) => visitor.visit_borrowed_str(s),
            Value::Array(items) => {
                let mut seq = Seq(items.iter());
                let value = visitor.visit_seq(&mut seq)?;
                match seq.0.len() {
                    0 => Ok(value),
                    _ => Err(Error::invalid_length(items.len(), &"fewer elements")),
                }
            }
            Value::Object(map) => visitor.visit_map(Entries::new(map)),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Object(map) => visitor.visit_map(Entries::new(map)),
            other => Err(Error::invalid_type(unexpected(other), &visitor)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::String(variant) => visitor.visit_enum(variant.as_str().into_deserializer()),
            Value::Object(map) if map.len() == 1 => {
                let Some((variant, value)) = map.iter().next() else {
                    return Err(Error::custom("expected a map with a single key"));
                };
                visitor.visit_enum(Variant { variant, value })
            }
            Value::Object(_) => Err(Error::invalid_value(
                Unexpected::Map,
                &"a map with a single key",
            )),
            other => Err(Error::invalid_type(unexpected(other), &"a string or a map")),
        }
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map identifier
        ignored_any
    }
}

struct Seq<'de>(std::slice::Iter<'de, Value>);

impl<'de> SeqAccess<'de> for Seq<'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0
            .next()
            .map(|v| seed.deserialize(Strict(v)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Entries<'de> {
    iter: serde_json::map::Iter<'de>,
    value: Option<&'de Value>,
}

impl<'de> Entries<'de> {
    fn new(map: &'de Map<String, Value>) -> Self {
        Entries {
            iter: map.iter(),
            value: None,
        }
    }
}

impl<'de> MapAccess<'de> for Entries<'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        match self.iter.next() {
            Some((key, value)) => {
                self.value = Some(value);
                let key: de::value::BorrowedStrDeserializer<'de, Error> =
                    de::value::BorrowedStrDeserializer::new(key);
                seed.deserialize(key).map(Some)
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        match self.value.take() {
            Some(value) => seed.deserialize(Strict(value)),
            None => Err(Error::custom("value is missing")),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.iter.len())
    }
}

struct Variant<'de> {
    variant: &'de str,
    value: &'de Value,
}

impl<'de> EnumAccess<'de> for Variant<'de> {
    type Error = Error;
    type Variant = Strict<'de>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Strict<'de>), Error> {
        let variant: de::value::BorrowedStrDeserializer<'de, Error> =
            de::value::BorrowedStrDeserializer::new(self.variant);
        Ok((seed.deserialize(variant)?, Strict(self.value)))
    }
}

impl<'de> VariantAccess<'de> for Strict<'de> {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.0 {
            Value::Null => Ok(()),
            other => Err(Error::invalid_type(unexpected(other), &"unit variant")),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(_) => de::Deserializer::deserialize_any(self, visitor),
            other => Err(Error::invalid_type(unexpected(other), &"tuple variant")),
        }
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_struct(self, "", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde::Deserialize;
    use serde_json::json;
    use std::collections::BTreeMap;

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        #[serde(default)]
        n: u32,
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Kind {
        Plain,
        Counted(Vec<u64>),
        Shaped { inner: Inner },
    }

    #[derive(Debug, PartialEq, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        #[serde(default)]
        inner: Option<Inner>,
        #[serde(default)]
        list: Vec<Inner>,
        #[serde(default)]
        map: BTreeMap<String, f64>,
        #[serde(default)]
        kind: Option<Kind>,
        #[serde(default)]
        any: Option<Value>,
    }

    #[test]
    fn reads_what_serde_json_reads_from_objects() {
        let v = json!({
            "inner": {"n": 3}, "list": [{}, {"n": 1}], "map": {"a": 1, "b": 2.5},
            "kind": {"counted": [1, 2]}, "any": [1, {"x": null}]
        });
        let strict: Outer = from_value(&v).unwrap();
        let loose: Outer = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(strict, loose);
        for kind in [json!("plain"), json!({"shaped": {"inner": {}}})] {
            let v = json!({ "kind": kind });
            assert_eq!(
                from_value::<Outer>(&v).unwrap(),
                serde_json::from_value::<Outer>(v.clone()).unwrap()
            );
        }
    }

    #[test]
    fn refuses_a_sequence_for_a_struct_at_any_depth() {
        for v in [
            json!([]),
            json!({"inner": []}),
            json!({"inner": [1]}),
            json!({"list": [[]]}),
            json!({"kind": {"shaped": {"inner": []}}}),
        ] {
            // serde_json itself takes each of these.
            assert!(serde_json::from_value::<Outer>(v.clone()).is_ok(), "{v}");
            let e = from_value::<Outer>(&v).unwrap_err();
            assert!(e.to_string().contains("invalid type: sequence"), "{v}: {e}");
        }
    }

    #[test]
    fn errors_are_serde_jsons() {
        for v in [
            json!({"inner": {"n": -1}}),
            json!({"inner": {"m": 1}}),
            json!({"kind": "nope"}),
            json!({"kind": {"plain": null, "counted": []}}),
            json!({"map": {"a": "x"}}),
        ] {
            assert!(from_value::<Outer>(&v).is_err(), "{v}");
            assert!(serde_json::from_value::<Outer>(v.clone()).is_err(), "{v}");
        }
    }
}
