"""Cluster placement (``env.placement: ray``): envs in pooled Ray actors (:mod:`.remote_env`) and the
tool services their actors share per node or per cluster (:mod:`.services`). Envs declare the
services they use (:attr:`agentrl.env.TextEnv.shared_services`); nothing here knows an env family.

Kept import-free: ``ray`` is imported only when Ray placement is used."""
