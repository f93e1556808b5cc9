"""Thin absl mains over the library, each `python -m experiments.<name>`.

Launchers: cascade, sft, rl, reward_model, judge, rerun_stage, recover,
sweep, plan, import_hf, export_hf, evaluate, verify. Tools: convert_data,
convert_checkpoint, compare_runs, curves, decoupled_model, results_index.
Studies: mopd_vs_grpo, judge_agreement. The claims' rules, measures and
tables: claims/. Benchmarks live apart, in benchmarks/.
"""
