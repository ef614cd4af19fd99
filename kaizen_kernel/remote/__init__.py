"""run_code kernels on a remote Jupyter Kernel Gateway (or Enterprise Gateway).

- :mod:`.client`: Kaizen's side of a gateway deployment (settings, the start request's
  environment, the websocket channel client);
- :mod:`.kernel`: the gateway kernel pool and kernels, started and driven like local ones;
- :mod:`.prelude`: the kernel-side code that receives files over the kernel protocol.
"""
