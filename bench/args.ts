// Command-line options of the benchmarks: `--name value` (or `--name=value`) after `npm run bench -- <name>`.

/** The value after `flag` in argv (or of `flag=value`), or `dflt` when it is absent. */
export const optionReader =
  (argv: ReadonlyArray<string>) =>
  (flag: string, dflt: string): string => {
    const joined = argv.find((a) => a.startsWith(`${flag}=`))
    if (joined !== undefined) return joined.slice(flag.length + 1)
    const i = argv.indexOf(flag)
    return i >= 0 && argv[i + 1] !== undefined ? argv[i + 1]! : dflt
  }
