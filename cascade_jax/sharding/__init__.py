"""Logical axes, sharding rules and meshes: the public sharding API."""

from cascade_jax.sharding._params import abstract_state
from cascade_jax.sharding._params import constrain_rows
from cascade_jax.sharding._params import logical_axes_of
from cascade_jax.sharding._params import pad_rows
from cascade_jax.sharding._params import put
from cascade_jax.sharding._params import shard_model
from cascade_jax.sharding._params import state_shardings
from cascade_jax.sharding._params import to_host
from cascade_jax.sharding._rules import DEFAULT_RULES
from cascade_jax.sharding._rules import inference_rules
from cascade_jax.sharding._rules import LOGICAL_AXES
from cascade_jax.sharding._rules import make_mesh
from cascade_jax.sharding._rules import MESH_AXES
from cascade_jax.sharding._rules import Rules
from cascade_jax.sharding._rules import rules_from_config
from cascade_jax.sharding._rules import ShardingCtx
from cascade_jax.sharding._rules import validate_rules
