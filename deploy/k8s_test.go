package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/telemetry/metricname"
)

// scaledObject mirrors KEDA's keda.sh/v1alpha1 ScaledObject (its
// apis/keda/v1alpha1 types, as documented at keda.sh/docs/latest/reference/
// scaledobject-spec): KEDA's Go module cannot be required beside the
// Temporal server's Kubernetes libraries (it pins them with replace
// directives), so its fields are restated here; the Kubernetes parts are
// the real types. Decoding is strict, as for the rest.
type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ScaleTargetRef struct {
			APIVersion             string `json:"apiVersion,omitempty"`
			Kind                   string `json:"kind,omitempty"`
			Name                   string `json:"name"`
			EnvSourceContainerName string `json:"envSourceContainerName,omitempty"`
		} `json:"scaleTargetRef"`
		PollingInterval       *int32 `json:"pollingInterval,omitempty"`
		InitialCooldownPeriod *int32 `json:"initialCooldownPeriod,omitempty"`
		CooldownPeriod        *int32 `json:"cooldownPeriod,omitempty"`
		IdleReplicaCount      *int32 `json:"idleReplicaCount,omitempty"`
		MinReplicaCount       *int32 `json:"minReplicaCount,omitempty"`
		MaxReplicaCount       *int32 `json:"maxReplicaCount,omitempty"`
		Advanced              *struct {
			HorizontalPodAutoscalerConfig *struct {
				Name     string                                         `json:"name,omitempty"`
				Behavior *autoscalingv2.HorizontalPodAutoscalerBehavior `json:"behavior,omitempty"`
			} `json:"horizontalPodAutoscalerConfig,omitempty"`
			RestoreToOriginalReplicaCount bool `json:"restoreToOriginalReplicaCount,omitempty"`
		} `json:"advanced,omitempty"`
		Triggers []struct {
			Type              string                         `json:"type"`
			Name              string                         `json:"name,omitempty"`
			UseCachedMetrics  bool                           `json:"useCachedMetrics,omitempty"`
			Metadata          map[string]string              `json:"metadata"`
			AuthenticationRef *struct{ Name, Kind string }   `json:"authenticationRef,omitempty"`
			MetricType        autoscalingv2.MetricTargetType `json:"metricType,omitempty"`
		} `json:"triggers"`
		Fallback *struct {
			FailureThreshold int32  `json:"failureThreshold"`
			Replicas         int32  `json:"replicas"`
			Behavior         string `json:"behavior,omitempty"`
		} `json:"fallback,omitempty"`
	} `json:"spec"`
}

// kustomization is the part of kustomize's Kustomization we use.
type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors"`
	} `json:"labels"`
	Resources []string `json:"resources"`
	Images    []struct {
		Name, NewName, NewTag string
	} `json:"images"`
}

// manifests decodes every object of deploy/k8s strictly into its type:
// a field the type does not have fails.
func manifests(t *testing.T) map[string]any {
	raw, err := os.ReadFile("k8s/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(raw, &k); err != nil {
		t.Fatalf("k8s/kustomization.yaml: %v", err)
	}
	files, _ := filepath.Glob("k8s/*.yaml")
	for _, f := range files {
		if name := filepath.Base(f); name != "kustomization.yaml" && !slices.Contains(k.Resources, name) {
			t.Errorf("%s is not in kustomization.yaml's resources", name)
		}
	}
	objects := map[string]any{}
	for _, res := range k.Resources {
		raw, err := os.ReadFile(filepath.Join("k8s", res))
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(raw), -1) {
			if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
				continue
			}
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s document %d: %v", res, i, err)
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 Deployment":
				obj = &appsv1.Deployment{}
			case "v1 Service":
				obj = &corev1.Service{}
			case "v1 ServiceAccount":
				obj = &corev1.ServiceAccount{}
			case "policy/v1 PodDisruptionBudget":
				obj = &policyv1.PodDisruptionBudget{}
			case "networking.k8s.io/v1 NetworkPolicy":
				obj = &networkingv1.NetworkPolicy{}
			case "keda.sh/v1alpha1 ScaledObject":
				obj = &scaledObject{}
			default:
				t.Fatalf("%s: %s %s is a kind this test does not know; add its type", res, tm.APIVersion, tm.Kind)
			}
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s: %s %s: %v", res, tm.APIVersion, tm.Kind, err)
			}
			objects[tm.Kind+"/"+nameOf(obj)] = obj
		}
	}
	return objects
}

func nameOf(obj any) string {
	b, _ := json.Marshal(obj)
	var m struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	json.Unmarshal(b, &m)
	return m.Metadata.Name
}

// A field no Kubernetes type has fails the strict decoding: the check is
// not blind.
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	doc := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n"
	if err := yaml.UnmarshalStrict([]byte(doc), &appsv1.Deployment{}); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Fatalf("a misspelt field decoded: %v", err)
	}
	so := "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata: {name: x}\nspec:\n  scaleTargetRef: {name: a}\n  cooldown: 5\n  triggers: []\n"
	if err := yaml.UnmarshalStrict([]byte(so), &scaledObject{}); err == nil || !strings.Contains(err.Error(), "cooldown") {
		t.Fatalf("a misspelt ScaledObject field decoded: %v", err)
	}
}

// TestKubernetesManifests checks what the manifests must say for the
// workers to behave: probes on the -metrics-listen port's /healthz and
// /readyz, a termination grace above -grace, GPUs requested by the agents,
// a disruption budget and the autoscaler on the agents, queries that name
// metrics the code records.
func TestKubernetesManifests(t *testing.T) {
	objs := manifests(t)
	for _, name := range []string{"durabletrain-workflows", "durabletrain-agent"} {
		d, ok := objs["Deployment/"+name].(*appsv1.Deployment)
		if !ok {
			t.Fatalf("no Deployment %s", name)
		}
		pod := d.Spec.Template.Spec
		if len(pod.Containers) != 1 {
			t.Fatalf("%s: %d containers", name, len(pod.Containers))
		}
		c := pod.Containers[0]
		args := map[string]string{}
		for _, a := range c.Args {
			k, v, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
			args[k] = v
		}
		_, port, _ := strings.Cut(args["metrics-listen"], ":")
		if port == "" {
			t.Errorf("%s: no -metrics-listen", name)
		}
		for probe, want := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
			if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != want {
				t.Errorf("%s: want a probe on %s", name, want)
				continue
			}
			p := probe.HTTPGet.Port.String()
			for _, cp := range c.Ports {
				if cp.Name == p {
					p = strconv.Itoa(int(cp.ContainerPort))
				}
			}
			if p != port {
				t.Errorf("%s: %s probe on port %s; the worker serves it on %s", name, want, p, port)
			}
		}
		grace, err := time.ParseDuration(args["grace"])
		if err != nil {
			t.Errorf("%s: -grace %q: %v", name, args["grace"], err)
		} else if pod.TerminationGracePeriodSeconds == nil || time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second < grace+5*time.Second {
			t.Errorf("%s: terminationGracePeriodSeconds %v; want at least -grace %v and 5 s to report", name, pod.TerminationGracePeriodSeconds, grace)
		}
		if c.SecurityContext == nil || c.SecurityContext.AllowPrivilegeEscalation == nil || *c.SecurityContext.AllowPrivilegeEscalation {
			t.Errorf("%s: privilege escalation allowed", name)
		}
	}
	agent := objs["Deployment/durabletrain-agent"].(*appsv1.Deployment)
	if q := agent.Spec.Template.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; q.Value() < 1 {
		t.Error("the agents ask for no nvidia.com/gpu")
	}
	pdb, ok := objs["PodDisruptionBudget/durabletrain-agent"].(*policyv1.PodDisruptionBudget)
	if !ok || pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Error("want a PodDisruptionBudget letting one agent go at a time")
	}
	so, ok := objs["ScaledObject/durabletrain-agent"].(*scaledObject)
	if !ok || so.Spec.ScaleTargetRef.Name != "durabletrain-agent" || len(so.Spec.Triggers) != 1 {
		t.Fatal("want a ScaledObject on the agents' Deployment with one trigger")
	}
	query := so.Spec.Triggers[0].Metadata["query"]
	for _, m := range []string{metricname.Slots, metricname.SlotsWanted, fmt.Sprintf("task_queue=%q", spec.DefaultTaskQueue)} {
		if !strings.Contains(query, m) {
			t.Errorf("the ScaledObject's query %q does not use %s", query, m)
		}
	}
	if b := so.Spec.Advanced.HorizontalPodAutoscalerConfig.Behavior; b == nil || b.ScaleDown == nil || b.ScaleDown.StabilizationWindowSeconds == nil || *b.ScaleDown.StabilizationWindowSeconds < 300 {
		t.Error("scale-down needs a stabilization window longer than a gang's back-off, or the backlog's flapping removes agents")
	}
	var out bytes.Buffer
	for k := range objs {
		out.WriteString(k + " ")
	}
	t.Logf("decoded strictly: %s", out.String())
}
