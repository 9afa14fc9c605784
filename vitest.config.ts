// On a Node older than gradwire needs, one line saying so instead of suites failing one by one.
import "./bin/check-node.js"
import { defineConfig } from "vitest/config"

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Integration suites start real nats-server and worker processes; on a 2-core machine
    // running more than two files at once only adds contention.
    maxWorkers: 2,
    testTimeout: 60_000,
    hookTimeout: 60_000,
    teardownTimeout: 20_000,
    reporters: ["default", "json"],
    outputFile: { json: ".ci/vitest-report.json" }
  }
})
