"""pilot on a real Kubernetes control plane: etcd, kube-apiserver and
kube-controller-manager built from Kubernetes' own Go modules (tools/kube/build).

`control_plane` starts them once per test run (the session fixture `cluster`); each
test works in namespaces of its own. `kubelet` stands in for the node agent (binds a
Pod to a Node and writes its status) so the real controllers do the rest.
"""
