import os
import pytest

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
  v = os.environ.get('MIN_CACHE_S')
  if v is not None:
    import jax
    jax.config.update('jax_persistent_cache_min_compile_time_secs', float(v))
    jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
    print('min cache', jax.config.jax_persistent_cache_min_compile_time_secs, jax.config.jax_compilation_cache_dir)
