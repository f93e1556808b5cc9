"""Reading learning curves: the first step that reaches a score or closes part of a gap, and steps summarised over seeds.

No flags (the launchers that use it define theirs), so that tests and
notebooks import it freely.
"""

import numpy as np


def steps_to_reach(steps, scores, target):
  """The first step whose score reaches target, or None."""
  return next((s for s, v in zip(steps, scores) if v >= target), None)


def steps_to_close(steps, scores, target, fraction):
  """The first step that closed `fraction` of the gap from the start
  (scores[0]) to target, or None. MOPD converges on its teacher's score
  and hovers there, so 'reaching' the score itself is a coin flip at the
  eval's noise; a fraction of the gap is the robust reading."""
  start = scores[0]
  return steps_to_reach(steps, scores, start + fraction * (target - start))


def summarize(reached: list, horizon: int) -> dict:
  """Steps to the teacher over seeds: mean and range over the seeds that
  reached it, how many did, and a mean that counts a seed that did not as
  `horizon` (a lower bound on its steps)."""
  got = [s for s in reached if s is not None]
  return dict(per_seed=reached, reached=len(got), seeds=len(reached),
              mean=float(np.mean(got)) if got else None,
              min=min(got) if got else None, max=max(got) if got else None,
              mean_censored=float(np.mean([horizon if s is None else s
                                           for s in reached])))
