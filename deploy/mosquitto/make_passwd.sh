#!/bin/sh
# Password-file recipe: turn a plaintext "user:password" file into mosquitto's hashed password file.
#   usage: make_passwd.sh PLAINTEXT_FILE OUTPUT_PASSWD_FILE
# The plaintext file holds one "user:password" line per operator, gateway and device (the same
# names as make_acl.py). It is copied, hashed in place with `mosquitto_passwd -U` (PBKDF2-SHA512),
# and left readable by the broker alone: mode 0640, group mosquitto (broker_can_read.sh; README.md).
# Keep the plaintext out of the broker host (each client keeps only its own password, e.g. the
# gateway's mqtt.password_file).
set -eu
[ $# -eq 2 ] || { echo "usage: $0 PLAINTEXT_FILE OUTPUT_PASSWD_FILE" >&2; exit 2; }
command -v mosquitto_passwd >/dev/null || { echo "$0: mosquitto_passwd not found (apt-get install mosquitto)" >&2; exit 2; }
umask 077
cp "$1" "$2"
mosquitto_passwd -U "$2"
sh "$(dirname "$0")/broker_can_read.sh" "$2"
echo "wrote $2 ($(wc -l < "$2") users)"
