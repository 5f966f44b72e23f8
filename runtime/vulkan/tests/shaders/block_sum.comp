// out[g] = sum of x[g*128 + t] (t < 128, index < n) by a tree reduction in workgroup memory.
// Arguments: x@0 out@8 n@16 (int32): 20 bytes. 512 bytes of shared memory.
#version 450
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_scalar_block_layout : require
layout(local_size_x = 128) in;
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer F32 { float v[]; };
layout(push_constant, scalar) uniform Args { F32 x; F32 out_; int n; } args;
shared float partial[128];
void main() {
  uint t = gl_LocalInvocationID.x, i = gl_GlobalInvocationID.x;
  partial[t] = i < uint(args.n) ? args.x.v[i] : 0.0;
  barrier();
  for (uint half_ = 64; half_ > 0; half_ >>= 1) {
    if (t < half_) partial[t] += partial[t + half_];
    barrier();
  }
  if (t == 0) args.out_.v[gl_WorkGroupID.x] = partial[0];
}
