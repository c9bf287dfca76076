"""Serving: ``agentrl serve`` and the sockets agentrl's HTTP servers listen on.

One job (issue #45: packages by job): put a model behind the OpenAI API. ``server`` is the app
(HF engine), ``openai_protocol``/``chat_request``/``textstream`` parse requests and shape
responses, ``continuous`` batches requests between decode steps, ``vllm_server`` hands GPU
serving to vLLM's own server, ``sockets`` opens the listening sockets (also used by the env
servers in ``envs/search`` and ``envs/web``). Importing this package imports nothing else, so
envs stay light.
"""
