// gradwire CLI: parses flags and hands off to the actors and scheduler. Thin on purpose.
const [command] = process.argv.slice(2)
const usage = `usage: gradwire <command>

commands:
  start --head                 start (or join) a NATS server and run a node agent
  start --address nats://...   run a node agent that joins an existing cluster
  status [--json]              nodes, resources, backends and liveness
  stop                         stop the local agent (and the head's NATS server)
`
if (!command || command === "--help" || command === "-h" || command === "help") {
  console.log(usage)
  process.exit(0)
}
console.error(`gradwire: unknown command "${command}"\n\n${usage}`)
process.exit(2)
