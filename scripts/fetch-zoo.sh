#!/usr/bin/env bash
# The real-model zoo (docs/model-zoo.md): pretrained ONNX models that PyPI
# wheels ship, and real inputs for them, nothing from a model hub.
#
#   scripts/fetch-zoo.sh
#
# Fills ${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}/zoo and prints that path on the
# last line:
#   magika.onnx        magika 1.0.3, models/standard_v3_3 (tf2onnx, int32 bytes in)
#   nudenet.onnx       nudenet 3.4.2, 320n.onnx (YOLOv8n detector, pytorch export)
#   silero-op15.onnx   silero-vad 6.2.3, 16 kHz, opset 15 (stateful, If branches)
#   silero-op18.onnx   silero-vad 6.2.3, opset 18 "ifless"
#   images/            the photographs scikit-image 0.25.2's wheel ships
#   speech.wav         sentences spoken by espeak-ng (Debian), with pauses
#   data/<model>/      calibration.npz and eval.npz (tools/zoo_inputs.py)
# Idempotent: a marker records what was fetched; about 40 MB of wheels, 20 s cold.
set -euo pipefail
cd "$(dirname "$0")/.."
deps="${EDGELOOP_DEPS:-$HOME/.edgeloop/deps}"
zoo="$deps/zoo"
wanted="magika==1.0.3 nudenet==3.4.2 silero-vad==6.2.3 scikit-image==0.25.2 inputs=$(sha256sum tools/zoo_inputs.py | cut -c1-16) pins=$(sha256sum scripts/pins.sha256 | cut -c1-16)"
if [ -f "$zoo/.fetched" ] && [ "$(cat "$zoo/.fetched")" = "$wanted" ]; then
  echo "$zoo"
  exit 0
fi
python="$(scripts/python-env.sh | tail -n 1)"
if ! command -v espeak-ng >/dev/null; then
  echo "==> installing espeak-ng (Debian) for the speech the VAD model hears" >&2
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends espeak-ng >&2; then
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends espeak-ng >&2
  fi
fi
rm -f "$zoo/.fetched"
mkdir -p "$zoo/wheels" "$zoo/images"
echo "==> fetching the zoo's wheels" >&2
# One platform, so each wheel (and its pin) is the same on any machine:
# only the models and photographs in them are used.
for pkg in magika==1.0.3 nudenet==3.4.2 silero-vad==6.2.3; do
  "$python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 "$pkg" -d "$zoo/wheels" >&2
done
# scikit-image only for its bundled photographs: any platform's wheel holds them.
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.11 --platform manylinux_2_17_x86_64 scikit-image==0.25.2 -d "$zoo/wheels" >&2
# shellcheck source=lib/pins.sh
. scripts/lib/pins.sh
verify_pinned "$zoo"/wheels/*.whl
"$python" - "$zoo" <<'PY'
import os, sys, zipfile
zoo = sys.argv[1]
def member(wheel_prefix, suffix, dest, folder="wheels"):
    d = os.path.join(zoo, folder)
    wheel = next(os.path.join(d, f) for f in sorted(os.listdir(d)) if f.startswith(wheel_prefix))
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(suffix))
        with open(dest + ".tmp", "wb") as f:
            f.write(z.read(name))
    os.replace(dest + ".tmp", dest)
member("magika-", "models/standard_v3_3/model.onnx", os.path.join(zoo, "magika.onnx"))
member("nudenet-", "320n.onnx", os.path.join(zoo, "nudenet.onnx"))
member("silero_vad-", "data/silero_vad_16k_op15.onnx", os.path.join(zoo, "silero-op15.onnx"))
member("silero_vad-", "data/silero_vad_op18_ifless.onnx", os.path.join(zoo, "silero-op18.onnx"))
stage = os.path.join(zoo, "wheels")
wheel = next(os.path.join(stage, f) for f in os.listdir(stage) if f.startswith("scikit_image-"))
with zipfile.ZipFile(wheel) as z:
    for n in z.namelist():
        base = os.path.basename(n)
        if n.startswith("skimage/data/") and base.endswith((".png", ".jpg")) and z.getinfo(n).file_size > 20000:
            with open(os.path.join(zoo, "images", base), "wb") as f:
                f.write(z.read(n))
PY
espeak-ng -m -s 150 -w "$zoo/speech.wav" '<speak>
Edge devices run the model that the cloud trained. <break time="900ms"/>
The rollout waits for the health probe before it moves traffic. <break time="1200ms"/>
If the accuracy drops, the device goes back to the previous slot. <break time="700ms"/>
Rain in the north, sun in the south, and wind along the coast. <break time="1500ms"/>
Seven, three, nine, one, zero. <break time="1s"/>
The quick brown fox jumps over the lazy dog. <break time="800ms"/>
A signed manifest says where every byte came from.
</speak>' >&2
echo "==> preparing the zoo's calibration and evaluation sets" >&2
"$python" tools/zoo_inputs.py "$zoo" >&2
printf '%s' "$wanted" >"$zoo/.fetched"
echo "$zoo"
