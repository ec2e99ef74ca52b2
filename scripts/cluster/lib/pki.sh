# shellcheck shell=bash
# The cluster's certificates and kubeconfigs, made with openssl: one private CA per state
# directory, a serving certificate for the API server and the kubelet, a client certificate
# per component (the identities RBAC's bootstrap roles expect), the service-account key pair.
# Made once per state and node address; `down` deletes them with the state.

PKI="$STATE/pki"

# new_key FILE: a P-256 key (fast to make; every component accepts it).
new_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

make_ca() {
    new_key "$PKI/ca.key"
    openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=tidegate-local-cluster-ca" -days 3650 \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$PKI/ca.crt" 2>/dev/null
}

# make_cert NAME SUBJECT USAGE [SANS]: NAME.crt/NAME.key signed by the CA; USAGE is
# serverAuth or clientAuth.
make_cert() {
    local name=$1 subject=$2 usage=$3 sans=${4:-}
    new_key "$PKI/$name.key"
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=$usage"
        [ -n "$sans" ] && echo "subjectAltName=$sans"
    } >"$PKI/$name.ext"
    openssl req -new -key "$PKI/$name.key" -subj "$subject" -out "$PKI/$name.csr" 2>/dev/null
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -days 365 -sha256 -extfile "$PKI/$name.ext" \
        -out "$PKI/$name.crt" 2>/dev/null
    rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

# write_kubeconfig FILE CERTNAME: a kubeconfig for the identity in CERTNAME.crt.
write_kubeconfig() {
    local file=$1 cert=$2
    cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: tidegate-local
    cluster:
      server: https://127.0.0.1:$APISERVER_PORT
      certificate-authority: $PKI/ca.crt
users:
  - name: $cert
    user:
      client-certificate: $PKI/$cert.crt
      client-key: $PKI/$cert.key
contexts:
  - name: tidegate-local
    context:
      cluster: tidegate-local
      user: $cert
current-context: tidegate-local
EOF
}

# make_pki NODE_IP: everything, unless this state already has it for this address.
make_pki() {
    local ip=$1
    if [ -f "$PKI/.node-ip" ] && [ "$(cat "$PKI/.node-ip")" = "$ip" ]; then
        return 0
    fi
    have openssl || die "openssl is needed to make the cluster's certificates"
    rm -rf "$PKI"
    mkdir -p "$PKI"
    chmod 700 "$PKI"
    make_ca
    local apiserver_sans="DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    apiserver_sans+=",DNS:kubernetes.default.svc.$CLUSTER_DOMAIN,DNS:localhost,DNS:$NODE_NAME"
    apiserver_sans+=",IP:127.0.0.1,IP:$ip,IP:$KUBERNETES_SERVICE_IP"
    make_cert apiserver "/CN=kube-apiserver" serverAuth "$apiserver_sans"
    make_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
    make_cert admin "/O=system:masters/CN=tidegate-local-admin" clientAuth
    make_cert controller-manager "/CN=system:kube-controller-manager" clientAuth
    make_cert scheduler "/CN=system:kube-scheduler" clientAuth
    make_cert kube-proxy "/CN=system:kube-proxy" clientAuth
    make_cert kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
    make_cert kubelet-serving "/CN=$NODE_NAME" serverAuth "DNS:$NODE_NAME,IP:$ip,IP:127.0.0.1"
    new_key "$PKI/sa.key"
    openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    write_kubeconfig "$KUBECONFIG_ADMIN" admin
    write_kubeconfig "$STATE/controller-manager.kubeconfig" controller-manager
    write_kubeconfig "$STATE/scheduler.kubeconfig" scheduler
    write_kubeconfig "$STATE/kube-proxy.kubeconfig" kube-proxy
    write_kubeconfig "$STATE/kubelet.kubeconfig" kubelet-client
    printf '%s' "$ip" >"$PKI/.node-ip"
}
