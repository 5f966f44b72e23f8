// "indirect" arguments: 168 bytes, more than a 128-byte push-constant range, so the push
// constants hold one device address of the argument block:
//   x[16]@0..127 (device addresses), out@128, n@136 (int32), scale@140 (float32),
//   bias@144 (int64), u32@152 (uint32), u64@160 (uint64)
// out[i] = scale * sum_k (k + 1) * x[k][i] + bias + u32 + u64. Needs int64.
#version 450
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_scalar_block_layout : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(local_size_x = 32) in;
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer F32 { float v[]; };
layout(buffer_reference, scalar, buffer_reference_align = 8) readonly buffer ArgBlock {
  uint64_t x[16];  // device addresses as integers (glslang under-aligns loads of
  uint64_t out_;   // buffer references from a buffer reference: spirv-val rejects them)
  int n;
  float scale;
  int64_t bias;
  uint u32;
  uint pad;
  uint64_t u64;
};
layout(push_constant) uniform Push { ArgBlock args; } pc;
void main() {
  uint i = gl_GlobalInvocationID.x;
  ArgBlock a = pc.args;
  if (i >= uint(a.n)) return;
  float acc = 0.0;
  for (int k = 0; k < 16; ++k) acc += float(k + 1) * F32(a.x[k]).v[i];
  F32(a.out_).v[i] = a.scale * acc + float(a.bias) + float(a.u32) + float(a.u64);
}
