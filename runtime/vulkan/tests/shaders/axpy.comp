// c[i] = a[i] + b[i] * s for i < n. Arguments: a@0 b@8 c@16 (device addresses), n@24 (int32),
// s@28 (float32): 32 bytes of push constants.
#version 450
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_scalar_block_layout : require
layout(local_size_x = 64) in;
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer F32 { float v[]; };
layout(push_constant, scalar) uniform Args { F32 a; F32 b; F32 c; int n; float s; } args;
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < uint(args.n)) args.c.v[i] = args.a.v[i] + args.b.v[i] * args.s;
}
