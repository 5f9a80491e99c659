"""OpenAI-compatible HTTP server over the generation engine (``fullband serve``; the ``serve`` extra).

:mod:`~fullband.serve.engine` batches decoding (torch only), :mod:`~fullband.serve.app` is the HTTP layer
(FastAPI), :mod:`~fullband.serve.server` loads a checkpoint and runs uvicorn. Nothing is imported here, so
``fullband serve --help`` and ``import fullband`` stay light.
"""
