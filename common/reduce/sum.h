// The reduction engine: element-wise float sums, shared by dlcpd (a received chunk summed straight
// from the receive buffer into its accumulator) and the client's host stage (members' slots summed
// in shared memory). Vectorized for the best instruction set the CPU offers (chosen once at load
// time). Pure functions; safe from any thread on disjoint destinations.
#pragma once

#include <cstddef>

namespace dlcp::reduce {

// dst[i] += src[i] for i < n. dst and src must not overlap.
void SumInto(float* __restrict dst, const float* __restrict src, size_t n);

// dst[i] = a[i] + b[i] for i < n. dst overlaps neither.
void SumOf(float* __restrict dst, const float* __restrict a, const float* __restrict b, size_t n);

// The same sum as SumInto, one element at a time, with no vectorization: the reference for tests.
void SumIntoScalar(float* dst, const float* src, size_t n);

}  // namespace dlcp::reduce
