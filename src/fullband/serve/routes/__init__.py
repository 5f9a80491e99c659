"""The HTTP routes of ``fullband serve``, one module per group, each adding its routes to the app with the shared
:class:`~fullband.serve.state.ServerState`: ``completions`` and ``chat`` (on ``generation``'s request handling),
``info`` (models, health, metrics) and ``errors`` (the error body of every answer, the body limit, the API key)."""
