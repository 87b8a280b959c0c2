package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Phase is where a Checkpoint is in its life.
// +kubebuilder:validation:Enum=Pending;Creating;Succeeded;Failed
type Phase string

// The phases: Pending → Creating → Succeeded | Failed.
const (
	PhasePending   Phase = "Pending"
	PhaseCreating  Phase = "Creating"
	PhaseSucceeded Phase = "Succeeded"
	PhaseFailed    Phase = "Failed"
)

// Condition types (OpenKruise Agents' names).
const (
	// ConditionProgressing is true once the kubelet was asked to checkpoint.
	ConditionProgressing = "Progressing"
	// ConditionArchived is true once the snapshot is found in the store and
	// tagged cp-<uid>.
	ConditionArchived = "Archived"
	// ConditionReady is true once the Checkpoint succeeded (and, with
	// keepRunning false, the pod was deleted).
	ConditionReady = "Ready"
)

// Reasons, machine-readable, in status.reason and in conditions and events.
const (
	ReasonPodNotFound        = "PodNotFound"
	ReasonNotCryoPod         = "NotCryoPod"
	ReasonPodNotRunning      = "PodNotRunning"
	ReasonNoCheckpointTarget = "NoCheckpointTarget"
	ReasonStoreNotAllowed    = "StoreNotAllowed"
	ReasonSnapshotNotFound   = "SnapshotNotFound"
	ReasonKubeletFailed      = "KubeletFailed"
	ReasonTimeout            = "Timeout"
	ReasonInvalidSpec        = "InvalidSpec"
)

// Persistent contents. cryo always captures both.
const (
	ContentsMemory     = "memory"
	ContentsFilesystem = "filesystem"
)

// CheckpointSpec names the pod to checkpoint and what to do afterwards.
type CheckpointSpec struct {
	// PodName is the pod in the Checkpoint's namespace (OpenKruise Agents'
	// sandboxName).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	PodName string `json:"podName"`

	// ContainerName is the container the kubelet is asked to checkpoint
	// (default: the pod's first app container). Any container checkpoints
	// the whole VM.
	// +optional
	ContainerName string `json:"containerName,omitempty"`

	// KeepRunning false hibernates: the pod is deleted once the snapshot
	// is tagged.
	// +kubebuilder:default=true
	// +optional
	KeepRunning *bool `json:"keepRunning,omitempty"`

	// TTLAfterFinished deletes the Checkpoint (and its store tag) this long
	// after it finished: a Go duration ("90m", "1h30m") or Nd/Nh/Nm/Ns, more
	// than zero and at most 3650d (87600h); days are whole and alone ("7d",
	// not "1d12h" or "1.5d": write "36h").
	// +kubebuilder:validation:Pattern=`^[+]?((([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+|[0-9]+d)$`
	// +kubebuilder:validation:XValidation:rule=`!self.matches('^[+]?((([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+|[0-9]+d)$') || (self.endsWith('d') ? int(self.substring(0, size(self) - 1)) >= 1 && int(self.substring(0, size(self) - 1)) <= 3650 : duration(self) > duration('0s') && duration(self) <= duration('87600h'))`,message="spec.ttlAfterFinished must be more than zero and at most 3650d (87600h)"
	// +optional
	TTLAfterFinished string `json:"ttlAfterFinished,omitempty"`

	// Store, when set, must equal the repository of the pod's
	// cryo.dev/checkpoint-to annotation (fixed when the pod was created).
	// +optional
	Store string `json:"store,omitempty"`

	// PersistentContents is what the snapshot holds; cryo always captures
	// memory and filesystem, anything else is refused.
	// +kubebuilder:default={memory,filesystem}
	// +listType=set
	// +optional
	PersistentContents []PersistentContent `json:"persistentContents,omitempty"`
}

// PersistentContent is memory or filesystem.
// +kubebuilder:validation:Enum=memory;filesystem
type PersistentContent string

// CheckpointStatus is what the controller observed and did.
type CheckpointStatus struct {
	// +optional
	Phase Phase `json:"phase,omitempty"`
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Snapshot is the store URL pinned to the manifest,
	// "<repo-url>@sha256:<hex>".
	// +optional
	Snapshot string `json:"snapshot,omitempty"`
	// Node is the node the pod ran on.
	// +optional
	Node string `json:"node,omitempty"`
	// PodUID is the UID of the pod that was checkpointed.
	// +optional
	PodUID string `json:"podUID,omitempty"`
	// StoredBytes is the sum of the snapshot manifest's layer sizes.
	// +optional
	StoredBytes int64 `json:"storedBytes,omitempty"`
	// UploadedBytes is what this checkpoint uploaded (the rest was already
	// in the store), when the node reported it.
	// +optional
	UploadedBytes int64 `json:"uploadedBytes,omitempty"`
	// PauseWindow is how long the VM was paused (Go duration), when the
	// node reported it.
	// +optional
	PauseWindow string `json:"pauseWindow,omitempty"`
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// ExpireTime is when ttlAfterFinished deletes the Checkpoint.
	// +optional
	ExpireTime *metav1.Time `json:"expireTime,omitempty"`
	// Reason is machine-readable: PodNotFound, NotCryoPod, PodNotRunning,
	// NoCheckpointTarget, StoreNotAllowed, SnapshotNotFound, KubeletFailed,
	// Timeout, InvalidSpec.
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`

	// Target is the pod's checkpoint target (its cryo.dev/checkpoint-to)
	// the kubelet was asked to publish to: where the snapshot is looked
	// for, also once the pod is gone.
	// +optional
	Target string `json:"target,omitempty"`
	// PriorDigest is the manifest the pod's checkpoint tag named before the
	// kubelet was asked: a snapshot with this digest is never taken for
	// this Checkpoint's (restart safety).
	// +optional
	PriorDigest string `json:"priorDigest,omitempty"`
	// RequestTime is when the kubelet was last asked, RequestTimeout
	// seconds being its limit: a restarted controller does not ask again
	// while that call may still run on the node.
	// +optional
	RequestTime *metav1.Time `json:"requestTime,omitempty"`
	// +optional
	RequestTimeoutSeconds int64 `json:"requestTimeoutSeconds,omitempty"`
}

// Checkpoint asks for a snapshot of a running cryo pod, published to the
// pod's checkpoint store and tagged cp-<uid>.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ckpt,categories=cryo
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Pod",type=string,JSONPath=`.spec.podName`
// +kubebuilder:printcolumn:name="Size",type=integer,format=int64,JSONPath=`.status.storedBytes`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`,priority=1
// +kubebuilder:printcolumn:name="Snapshot",type=string,JSONPath=`.status.snapshot`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Checkpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// The spec is fixed at creation: a Checkpoint records one request.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: create another Checkpoint"
	Spec   CheckpointSpec   `json:"spec"`
	Status CheckpointStatus `json:"status,omitempty"`
}

// CheckpointList is a list of Checkpoints.
//
// +kubebuilder:object:root=true
type CheckpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Checkpoint `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Checkpoint{}, &CheckpointList{})
}
