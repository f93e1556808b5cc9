"""Multi-turn environments: the reset / step interface, tool calls, repositories in the sandbox.

Below `domains/` (which builds its agentic domains from these) and knows no
model; `rollout.run_episodes` drives environments with the sampler.
"""

from cascade_jax.envs._api import Environment
from cascade_jax.envs._api import Message
from cascade_jax.envs._api import run_scripted
from cascade_jax.envs._api import SingleTurn
from cascade_jax.envs._api import Step
from cascade_jax.envs._patch import apply_unified_diff
from cascade_jax.envs._patch import PatchError
from cascade_jax.envs._tools import answer_calls
from cascade_jax.envs._tools import cap
from cascade_jax.envs._tools import format_call
from cascade_jax.envs._tools import MAX_CALLS_PER_TURN
from cascade_jax.envs._tools import MAX_OUTPUT_CHARS
from cascade_jax.envs._tools import parse_tool_calls
from cascade_jax.envs._tools import Tool
from cascade_jax.envs._tools import TOOL_END
from cascade_jax.envs._tools import TOOL_START
from cascade_jax.envs._tools import tool_message
from cascade_jax.envs._tools import ToolCall
from cascade_jax.envs._tools import ToolCallError
from cascade_jax.envs._tools import Toolbox
from cascade_jax.envs._workspace import check_path
from cascade_jax.envs._workspace import TOOL_LIMITS
from cascade_jax.envs._workspace import Workspace
from cascade_jax.envs._workspace import WorkspaceLimits
from cascade_jax.envs._python import PYTHON_LIMITS
from cascade_jax.envs._python import PYTHON_TOOL
from cascade_jax.envs._python import PythonSession
from cascade_jax.envs._python import session_program
