// Command-line options of the benchmarks: `--name value` pairs after `npm run bench -- <name>`.

/** The value after `flag` in argv, or `dflt` when it is absent. */
export const optionReader =
  (argv: ReadonlyArray<string>) =>
  (flag: string, dflt: string): string => {
    const i = argv.indexOf(flag)
    return i >= 0 && argv[i + 1] !== undefined ? argv[i + 1]! : dflt
  }
