"""The paper's claims, decided by rules registered before their runs.

  python -m experiments.claims            # print both tables
  python -m experiments.claims --write    # write them (docs/claims/README.md, README.md)
  python -m experiments.claims --check    # exit 1 if a table is stale or a
                                          # rule did not come first

`rules` reads the rule files (docs/claims/), `measures` and
`hybrid_measures` read the result files, `verdicts` decide, `frozen` keeps
the functions of rules decided before their code changed, `history` checks
each rule against git, `tables` writes the tables. docs/guides/claims.md
says how a claim is registered and decided.
"""
