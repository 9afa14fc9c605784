// The environment that gives Dawn a software WebGPU adapter on a machine without a GPU: the
// SwiftShader Vulkan driver that Debian's chromium package ships in its library folder (the set-up
// script installs chromium with --test), with gradwire's opt-in for software adapters. The Vulkan
// loader beside it (libvulkan.so.1) is found through LD_LIBRARY_PATH, which the dynamic linker
// reads at process start: only processes started with this environment (workers, probe children,
// a test's child) see the adapter.
import { spawnSync } from "node:child_process"
import * as fs from "node:fs"
import * as path from "node:path"

const KNOWN = ["/usr/lib/chromium/vk_swiftshader_icd.json", "/usr/lib64/chromium/vk_swiftshader_icd.json"]

/** The SwiftShader driver manifest, or undefined when chromium is not installed. */
export const swiftShaderIcd = (): string | undefined => {
  const known = KNOWN.find((f) => fs.existsSync(f))
  if (known) return known
  const listed = spawnSync("dpkg", ["-L", "chromium"], { encoding: "utf8" }).stdout ?? ""
  return listed.split("\n").find((l) => l.endsWith("/vk_swiftshader_icd.json") && fs.existsSync(l))
}

/** Variables to add to a child's environment; throws, saying what to install, when the driver is missing. */
export const swiftShaderEnv = (): Record<string, string> => {
  const icd = swiftShaderIcd()
  if (!icd) {
    throw new Error(
      "the webgpu tests run on the SwiftShader Vulkan driver of Debian's chromium package, which is not installed: run `bash scripts/setup.sh --test`"
    )
  }
  const dir = path.dirname(icd)
  const ld = process.env.LD_LIBRARY_PATH
  return { VK_ICD_FILENAMES: icd, LD_LIBRARY_PATH: ld ? `${dir}${path.delimiter}${ld}` : dir, GRADWIRE_WEBGPU_SOFTWARE: "1" }
}
