#!/usr/bin/env bash
# Install, or uninstall, gatewayd on an edge box as a systemd service (run as root).
#
#   deploy/install-gateway.sh install [--extras camera,train] [options]
#   deploy/install-gateway.sh uninstall [--purge] [options]
#
# install (idempotent: run it again to upgrade; your config is never overwritten):
#   - a system user (--user, default edgefed; in group video when the camera extra is installed),
#   - the config dir (root:USER 0750) with gateway.toml from deploy/gateway.example.toml if none,
#   - the state dir (USER 0750), where the log, the control state and the blobs live,
#   - a venv under --prefix with edgefed and the --extras asked for (pip, with constraints.txt),
#   - the unit deploy/systemd/gatewayd.service with these paths, enabled and started when systemd
#     runs the box (otherwise the script says how to start the unit's command by hand).
# uninstall: stops and removes the unit and the venv; --purge also removes the config, the state
# (the log: whatever was not yet uploaded is lost) and the user.
#
# Options (defaults in brackets): --source DIR [this script's repository], --prefix DIR [/opt/edgefed],
# --config-dir DIR [/etc/edgefed], --state-dir DIR [/var/lib/edgefed], --unit-dir DIR
# [/etc/systemd/system], --user NAME [edgefed], --python PATH [/usr/bin/python3, >= 3.11],
# --extras LIST [none].
set -euo pipefail

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
die() { echo "install-gateway: $*" >&2; exit 1; }

action=${1:-}
[ "$action" = install ] || [ "$action" = uninstall ] || usage
shift
source_dir=$(cd "$(dirname "$0")/.." && pwd)
prefix=/opt/edgefed
config_dir=/etc/edgefed
state_dir=/var/lib/edgefed
unit_dir=/etc/systemd/system
user=edgefed
python=/usr/bin/python3  # the system's: the service user must be able to run it (not a pyenv under /root)
[ -x "$python" ] || python=python3
extras=
purge=no
while [ $# -gt 0 ]; do
  case $1 in
    --source) source_dir=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --config-dir) config_dir=$2; shift 2 ;;
    --state-dir) state_dir=$2; shift 2 ;;
    --unit-dir) unit_dir=$2; shift 2 ;;
    --user) user=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --extras) extras=$2; shift 2 ;;
    --purge) purge=yes; shift ;;
    -h|--help) usage ;;
    *) die "unknown option $1 (--help lists them)" ;;
  esac
done
[ "$(id -u)" = 0 ] || die "run as root (it creates a user, directories and a systemd unit)"
unit=$unit_dir/gatewayd.service
systemd_running() { [ -d /run/systemd/system ]; }

render_unit() {
  # The shipped unit with this install's paths and user. StateDirectory= and ConfigurationDirectory=
  # name folders under /var/lib and /etc; elsewhere ReadWritePaths= alone opens the state dir.
  local state_rel=${state_dir#/var/lib/} config_rel=${config_dir#/etc/}
  sed -e "s#/opt/edgefed#$prefix#g" -e "s#/etc/edgefed#$config_dir#g" -e "s#/var/lib/edgefed#$state_dir#g" \
      -e "s#^User=.*#User=$user#" -e "s#^Group=.*#Group=$user#" \
      -e "s#^StateDirectory=.*#StateDirectory=$state_rel#" \
      -e "s#^ConfigurationDirectory=.*#ConfigurationDirectory=$config_rel#" \
      "$source_dir/deploy/systemd/gatewayd.service" |
    if [ "$state_rel" = "$state_dir" ]; then grep -v '^StateDirectory'; else cat; fi |
    if [ "$config_rel" = "$config_dir" ]; then grep -v '^ConfigurationDirectory'; else cat; fi
}

install_gateway() {
  [ -f "$source_dir/pyproject.toml" ] || die "$source_dir is not an edgefed source tree (--source)"
  if ! getent passwd "$user" >/dev/null; then
    useradd --system --user-group --home-dir "$state_dir" --no-create-home --shell /usr/sbin/nologin "$user"
    echo "install-gateway: created user $user"
  fi
  if [[ ",$extras," == *,camera,* || ",$extras," == *,all,* ]] && getent group video >/dev/null; then
    usermod -a -G video "$user"
  fi
  install -d -m 0750 -o root -g "$user" "$config_dir"
  install -d -m 0750 -o "$user" -g "$user" "$state_dir"
  install -d -m 0755 "$prefix" "$unit_dir"

  # the venv links to $python: the service runs it as $user
  runuser -u "$user" -- "$python" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null ||
    die "user $user cannot run $python, or it is older than 3.11 (--python another interpreter)"
  [ -x "$prefix/venv/bin/python" ] || "$python" -m venv "$prefix/venv"
  local spec=$source_dir
  [ -z "$extras" ] || spec="$source_dir[$extras]"
  echo "install-gateway: installing $spec into $prefix/venv"
  "$prefix/venv/bin/pip" install -q --upgrade -c "$source_dir/constraints.txt" "$spec"

  if [ ! -e "$config_dir/gateway.toml" ]; then
    sed -e "s#^data_dir = .*#data_dir = \"$state_dir\"#" "$source_dir/deploy/gateway.example.toml" \
      > "$config_dir/gateway.toml"
    chown root:"$user" "$config_dir/gateway.toml"
    chmod 0640 "$config_dir/gateway.toml"
    echo "install-gateway: wrote $config_dir/gateway.toml (edit gateway_id, [mqtt] and [uplink])"
  fi

  render_unit > "$unit.tmp" && mv "$unit.tmp" "$unit"
  chmod 0644 "$unit"
  if systemd_running; then
    systemctl daemon-reload
    systemctl enable --now gatewayd.service
    echo "install-gateway: gatewayd enabled and started (journalctl -u gatewayd -f)"
  else
    echo "install-gateway: systemd is not running here; the unit is in $unit. Start by hand:"
    echo "  setpriv --reuid=$user --regid=$user --init-groups -- $(sed -n 's/^ExecStart=//p' "$unit")"
  fi
}

uninstall_gateway() {
  if systemd_running && [ -e "$unit" ]; then
    systemctl disable --now gatewayd.service || true
  fi
  rm -f "$unit"
  if systemd_running; then systemctl daemon-reload; fi
  rm -rf "$prefix"
  if [ "$purge" = yes ]; then
    rm -rf "$config_dir" "$state_dir"
    if getent passwd "$user" >/dev/null; then userdel "$user"; fi
    echo "install-gateway: removed the unit, $prefix, $config_dir, $state_dir and user $user"
  else
    echo "install-gateway: removed the unit and $prefix; kept $config_dir and $state_dir (--purge removes them)"
  fi
}

"${action}_gateway"
