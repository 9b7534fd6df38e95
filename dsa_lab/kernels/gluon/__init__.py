"""Our warp-specialised Gluon kernel for Hopper (SM90), one family in four modules: `config` (its config
space and the arithmetic of its resources, plain Python the device code reads at compile time too),
`schedule` (the work-balanced persistent schedule made on the device, and the tail it leaves), `kernel`
(the device code) and `launch` (the backend: its checks, descriptors and the launch); `fused` is issue 27's
step, its logits then our split select. Imported here so that importing the family registers both backends."""

from dsa_lab.kernels.gluon import fused, launch  # noqa: F401  (register "gluon" and "gluon-fused")
