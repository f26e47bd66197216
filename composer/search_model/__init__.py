"""codebase_search's own embedding model: a small transformer encoder trained contrastively in JAX.

encoder.py   the model as pure functions (its NumPy twin, which the tools run: env/tools/search_encoder.py)
data.py      training pairs made offline (site-packages functions, task statements)
train.py     the contrastive loss and the training loop
python -m composer.search_model train --out DIR     (docs/search.md)
"""
