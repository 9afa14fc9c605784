// The WebGPU objects gradwire's webgpu kernels touch (fused-adam-webgpu.ts, webgpu-dispatch.ts),
// as far as they touch them: structural types, so that gradwire needs no WebGPU type package.
export interface BindGroupLayout {
  readonly __brand?: "layout"
}
export interface Pipeline {
  getBindGroupLayout(i: number): BindGroupLayout
}
export interface PassEncoder {
  setPipeline(p: Pipeline): void
  setBindGroup(i: number, g: unknown): void
  dispatchWorkgroups(x: number, y?: number, z?: number): void
}
