"""The gateway: the data path clients use (the OpenAI-compatible ``/v1`` API).

Its pure cores (``balance``, ``body``, ``sse``, ``holdback``, ``sizing``, ``errors``) are
plain functions over plain data, tested exhaustively; the ASGI route that calls them holds
what it needs in memory and makes no database query per request.
"""
