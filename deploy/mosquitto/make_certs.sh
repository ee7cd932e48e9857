#!/bin/sh
# Certificate recipe for an edgefed site (README.md beside this file, "Certificates"): a CA of your
# own, the broker's certificate, and a client certificate per gateway for mutual TLS.
#   usage: make_certs.sh DIR BROKER_NAMES [GATEWAY...]
#     DIR           where the files go (made if missing)
#     BROKER_NAMES  every name clients reach the broker by, as a subjectAltName list, e.g.
#                   "DNS:broker.site.example,IP:10.0.0.2" (clients check these, not the CN)
#     GATEWAY       a gateway id; its certificate (CN = the id) is its mqtt.cert_file/key_file
# Makes ca.pem + ca.key (once: a second run keeps the CA and signs new certificates with it),
# server.pem + server.key (the broker's certfile/keyfile) and GATEWAY.pem + GATEWAY.key.
# Validity: DAYS (default 825) for the certificates, CA_DAYS (default 3650) for the CA.
set -eu
[ $# -ge 2 ] || { echo "usage: $0 DIR BROKER_NAMES [GATEWAY...]" >&2; exit 2; }
command -v openssl >/dev/null || { echo "$0: openssl not found (apt-get install openssl)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
dir=$1 names=$2
shift 2
days=${DAYS:-825} ca_days=${CA_DAYS:-3650}
mkdir -p "$dir"
cd "$dir"
umask 077
# --- recipe (README.md shows this part) ---
key="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"  # a P-256 key, unencrypted
# 1. The CA: ca.pem goes to the broker and to every client; ca.key signs, keep it off the broker.
[ -f ca.key ] || openssl req -x509 $key -keyout ca.key -out ca.pem -days "$ca_days" \
  -subj "/CN=edgefed site CA" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign"
# 2. The broker: its names in subjectAltName; a client refuses a broker reached by another name.
openssl req $key -keyout server.key -out server.csr -subj "/CN=edgefed broker"
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$names" > server.ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" \
  -extfile server.ext -out server.pem
# 3. One per gateway, for mutual TLS (listener 8884, require_certificate true): CN = the gateway id.
printf 'extendedKeyUsage=clientAuth\n' > client.ext
for gateway in "$@"; do
  openssl req $key -keyout "$gateway.key" -out "$gateway.csr" -subj "/CN=$gateway"
  openssl x509 -req -in "$gateway.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" \
    -extfile client.ext -out "$gateway.pem"
done
# --- end of recipe ---
rm -f ./*.csr server.ext client.ext
chmod 0644 ./*.pem  # certificates are public; the keys stay 0600
sh "$here/broker_can_read.sh" server.key
echo "wrote $(pwd): ca.pem, server.pem, server.key${*:+, and for $*: NAME.pem, NAME.key}"
