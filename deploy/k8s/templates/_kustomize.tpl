{{- /*
The kustomize tree, read by Helm: a file's objects, and a kustomization's JSON patches applied to
the RayService, so the chart states nothing the tree states already. Templates that only change
objects are called as {{ $_ := include ... }}, the objects being shared maps.
*/ -}}

{{- /* The objects of a file of the tree (a path under deploy/k8s), as a list. */ -}}
{{- define "beamserve.read" -}}
{{- $text := .root.Files.Get .path -}}
{{- if not $text }}{{ fail (printf "%s is not in the chart" .path) }}{{ end -}}
{{- $objs := list -}}
{{- range $doc := regexSplit "(?m)^---\\s*$" $text -1 -}}
{{- $obj := fromYaml $doc -}}
{{- if $obj.Error }}{{ fail (printf "%s: %s" $.path $obj.Error) }}{{ end -}}
{{- if $obj }}{{ $objs = append $objs $obj }}{{ end -}}
{{- end -}}
{{- toJson $objs -}}
{{- end -}}

{{- /* The objects a kustomization's resources list (dir: "base", "components/api-keys"). */ -}}
{{- define "beamserve.resources" -}}
{{- $k := include "beamserve.kustomization" . | fromJson -}}
{{- $objs := list -}}
{{- range $file := $k.resources | default list -}}
{{- if not (hasSuffix ".yaml" $file) }}{{ fail (printf "%s/%s: only files are read" $.dir $file) }}{{ end -}}
{{- $objs = concat $objs (include "beamserve.read" (dict "root" $.root "path" (printf "%s/%s" $.dir $file)) | fromJsonArray) -}}
{{- end -}}
{{- toJson $objs -}}
{{- end -}}

{{- define "beamserve.kustomization" -}}
{{- $k := .root.Files.Get (printf "%s/kustomization.yaml" .dir) | fromYaml -}}
{{- if not $k }}{{ fail (printf "%s/kustomization.yaml is not in the chart" .dir) }}{{ end -}}
{{- toJson $k -}}
{{- end -}}

{{- /* Apply a kustomization's patches (inline or from a file) to the RayService .rayservice. */ -}}
{{- define "beamserve.patches" -}}
{{- $k := include "beamserve.kustomization" . | fromJson -}}
{{- range $p := $k.patches | default list -}}
{{- if or (ne $p.target.kind "RayService") (ne $p.target.name $.rayservice.metadata.name) -}}
{{- fail (printf "%s: a patch of %s/%s; the chart applies patches of the RayService only" $.dir $p.target.kind $p.target.name) -}}
{{- end -}}
{{- $ops := list -}}
{{- if $p.patch }}{{ $ops = fromYamlArray $p.patch }}{{ else }}{{ $ops = $.root.Files.Get (printf "%s/%s" $.dir $p.path) | fromYamlArray }}{{ end -}}
{{- range $op := $ops -}}
{{- $_ := include "beamserve.op" (dict "obj" $.rayservice "op" $op "dir" $.dir) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* One JSON patch operation (RFC 6902): add or replace at a path, "-" appending to a list. */ -}}
{{- define "beamserve.op" -}}
{{- $op := .op -}}
{{- if not (has $op.op (list "add" "replace")) }}{{ fail (printf "%s: patch op %q: the chart applies add and replace" .dir $op.op) }}{{ end -}}
{{- $keys := list -}}
{{- range $seg := rest (splitList "/" $op.path) }}{{ $keys = append $keys ($seg | replace "~1" "/" | replace "~0" "~") }}{{ end -}}
{{- $last := last $keys -}}
{{- $walk := initial $keys -}}
{{- if eq $last "-" }}{{ $walk = initial $walk }}{{ end -}}
{{- $at := .obj -}}
{{- range $key := $walk -}}
{{- if kindIs "slice" $at }}{{ $at = index $at (atoi $key) }}{{ else }}{{ $at = index $at $key }}{{ end -}}
{{- if kindIs "invalid" $at }}{{ fail (printf "%s: %s: no %s" $.dir $op.path $key) }}{{ end -}}
{{- end -}}
{{- if not (kindIs "map" $at) }}{{ fail (printf "%s: %s: the chart patches keys of objects and appends to lists" .dir $op.path) }}{{ end -}}
{{- if eq $last "-" -}}
{{- $name := last (initial $keys) -}}
{{- $_ := set $at $name (append (index $at $name | default list) (deepCopy $op.value)) -}}
{{- else -}}
{{- $_ := set $at $last (deepCopy $op.value) -}}
{{- end -}}
{{- end -}}
