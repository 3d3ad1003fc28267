//! The codec every generated client and server here uses: prost's, with a
//! small first buffer.
//!
//! tonic gives each call an encode buffer (and each request a decode
//! buffer) of 8 KiB up front. A long-lived stream keeps its encode buffer
//! for as long as it is open, and a control plane holds one watch stream
//! per connected device: at 10 000 devices that was 8 KiB × 10 000, about
//! a tenth of the control plane's heap at rest (a heap profile of
//! `fleet-scale`, see docs/fleet-scale.md), for messages of a few hundred
//! bytes. A message larger than the first buffer grows it once to its
//! encoded size, as it did past 8 KiB, so large messages (artifact
//! chunks, tensors) cost the same as before.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// The first size of a call's encode and decode buffers.
const FIRST_BUFFER_BYTES: usize = 512;

/// tonic's default: a stream's encoded messages are handed on once this
/// many bytes are ready.
const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(FIRST_BUFFER_BYTES, YIELD_THRESHOLD_BYTES)
}

/// [`ProstCodec`] with [`FIRST_BUFFER_BYTES`] buffers (see the module).
#[derive(Debug, Clone)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        LeanCodec(PhantomData)
    }
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}
