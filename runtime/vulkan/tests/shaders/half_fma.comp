// c[i] = a[i] * b[i] + half(s) in float16 storage and arithmetic.
// Arguments: a@0 b@8 c@16, n@24 (int32), s@28 (float32): 32 bytes. Needs float16, storage16.
#version 450
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_scalar_block_layout : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 32) in;
layout(buffer_reference, scalar, buffer_reference_align = 2) buffer F16 { float16_t v[]; };
layout(push_constant, scalar) uniform Args { F16 a; F16 b; F16 c; int n; float s; } args;
void main() {
  uint i = gl_GlobalInvocationID.x;
  if (i < uint(args.n)) args.c.v[i] = args.a.v[i] * args.b.v[i] + float16_t(args.s);
}
