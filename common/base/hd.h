// Functions marked DLCP_HD compile for both the host and a CUDA device, so that the CPU packer
// and the GPU kernel run literally the same arithmetic (client/packer/). Outside nvcc it is empty.
#pragma once

#if defined(__CUDACC__)
#define DLCP_HD __host__ __device__
#else
#define DLCP_HD
#endif
