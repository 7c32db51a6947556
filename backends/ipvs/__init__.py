"""The IPVS dataplane: upstream kube-proxy's IPVS mode (being built; see ``plan``)."""
