// <immintrin.h> for the AVX-512 translation units. GCC 12 warns about the deliberately undefined
// upper lanes inside its own AVX-512 headers (GCC bug 105593); the warning says nothing about the
// units, so it is off for the rest of the unit that includes this.
#pragma once
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
