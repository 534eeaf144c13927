"""The client dialects beside chat completions: plain functions over plain data, no I/O.

Every generating dialect is served through one chat-completions request to the engine
(``responses``: OpenAI's Responses API; ``messages``: Anthropic's Messages API), so the
guard, the usage count and the stream's framing stay those of chat: a dialect's request
becomes a chat body (``read`` then ``chat_request``), the engine's whole answer becomes
the dialect's (``answer``), and its stream becomes the dialect's typed events through a
translator fed the chat chunks the guard released (``ResponsesStream``,
``MessagesStream``), which also writes the dialect's own ending for a refusal or a failed
stream. ``rerank`` reads and writes ``/v1/rerank`` and Cohere's ``/v2/rerank``;
``sessions`` finds the session a request names; ``engines`` says which engine serves
which dialect natively. ``docs/dialects.md`` describes them.
"""
