"""Serving one model over HTTP (``cdlm-serve``): LitServe's OpenAI spec with cdlm's options
(``spec``), the requests it reads (``requests``) and the model that draws batches of them
(``api``). LitServe is an optional dependency (``pip install 'cdlm[serve]'``), so this package
imports it and nothing else in cdlm imports this package."""
