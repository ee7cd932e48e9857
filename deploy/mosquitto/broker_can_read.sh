#!/bin/sh
# Let the broker read FILE... (its password file, its TLS key): mosquitto opens them after it has
# dropped root for its own user (mosquitto, group mosquitto), so a root-only 0600 file stops it at
# start ("Unable to open pwfile", "Unable to load server key file"). Each FILE becomes group
# MOSQUITTO_GROUP (default mosquitto) and mode 0640: the owner (root) writes, the broker reads,
# no one else. Used by make_passwd.sh and make_certs.sh; see README.md beside it.
#   usage: broker_can_read.sh FILE...
set -eu
group=${MOSQUITTO_GROUP:-mosquitto}
if ! getent group "$group" >/dev/null; then
  echo "$0: no group $group here: $* stay mode 0600; make them readable by the user the broker runs as" >&2
  exit 0
fi
for file in "$@"; do
  if chgrp "$group" "$file" 2>/dev/null; then
    chmod 0640 "$file"
  else
    echo "$0: cannot give $file to group $group (run as root, or: chgrp $group $file && chmod 0640 $file)" >&2
  fi
done
