// out[c * rows + r] = x[r * cols + c] on a 2-D grid of 8x8 work groups.
// Arguments: x@0 out@8 rows@16 cols@20 (int32): 24 bytes.
#version 450
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_scalar_block_layout : require
layout(local_size_x = 8, local_size_y = 8) in;
layout(buffer_reference, scalar, buffer_reference_align = 4) buffer F32 { float v[]; };
layout(push_constant, scalar) uniform Args { F32 x; F32 out_; int rows; int cols; } args;
void main() {
  uint c = gl_GlobalInvocationID.x, r = gl_GlobalInvocationID.y;
  if (r < uint(args.rows) && c < uint(args.cols)) args.out_.v[c * uint(args.rows) + r] = args.x.v[r * uint(args.cols) + c];
}
