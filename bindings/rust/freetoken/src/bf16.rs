//! The bfloat16 value type passed to and from the library.

use std::fmt;


/// A bfloat16 value as its 16-bit pattern (the layout of `half::bf16`: `repr(transparent)` over
/// `u16`), so `&[Bf16]` passes to the library as `const uint16_t *`.
#[repr(transparent)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bf16(pub u16);

impl Bf16 {
    pub const fn from_bits(bits: u16) -> Bf16 {
        Bf16(bits)
    }
    pub const fn to_bits(self) -> u16 {
        self.0
    }
    /// Rounds to the nearest bf16, ties to even; NaN stays NaN (quiet), infinities stay.
    pub fn from_f32(f: f32) -> Bf16 {
        let u = f.to_bits();
        if f.is_nan() {
            return Bf16(((u >> 16) as u16) | 0x0040);
        }
        Bf16((u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16)
    }
    /// The exact f32 value.
    pub fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl fmt::Debug for Bf16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_f32())
    }
}

impl From<f32> for Bf16 {
    fn from(f: f32) -> Bf16 {
        Bf16::from_f32(f)
    }
}

impl From<Bf16> for f32 {
    fn from(b: Bf16) -> f32 {
        b.to_f32()
    }
}
