#!/usr/bin/env bash
# The multi-node test tier's tools, from Debian's packages (Debian or Ubuntu, as root): sshd and ssh,
# pdsh, SLURM (slurmctld, slurmd, the client commands) and munge. Installs what is missing and starts
# no service: the tests start their own daemons inside the nodes they make, and stop them.
#   bash scripts/install_cluster_tools.sh
set -euo pipefail
packages=(openssh-server openssh-client pdsh slurm-wlm munge)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
  echo "install_cluster_tools.sh: ${missing[*]} missing; installing them needs root and apt-get" >&2
  exit 1
fi
# No service may start from the packages' scripts: policy-rc.d says no for the time of the install.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy"
  trap 'rm -f "$policy"' EXIT
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
echo "install_cluster_tools.sh: installed ${missing[*]}"
