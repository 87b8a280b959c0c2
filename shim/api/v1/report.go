package shimapi

// CheckpointReport is a checkpoint's result as `cryoctl checkpoint -o json`
// prints it (and `cryoctl bench` reads it).
type CheckpointReport struct {
	Ref            string `json:"ref"`
	Digest         string `json:"digest"`
	PauseWindowMS  int64  `json:"pauseWindowMs"`
	DurationMS     int64  `json:"durationMs"`
	RawBytes       int64  `json:"rawBytes"`
	StoredBytes    int64  `json:"storedBytes"`
	UploadedBytes  int64  `json:"uploadedBytes"`
	Chunks         int64  `json:"chunks"`
	ChunksUploaded int64  `json:"chunksUploaded"`
	DeltaChunks    int64  `json:"deltaChunks"`
}

// Report turns the response into its printed form.
func (r *CheckpointResponse) Report() CheckpointReport {
	return CheckpointReport{
		Ref: r.Ref, Digest: r.Digest, PauseWindowMS: r.PauseWindow.AsDuration().Milliseconds(),
		DurationMS: r.Duration.AsDuration().Milliseconds(), RawBytes: r.RawBytes, StoredBytes: r.StoredBytes,
		UploadedBytes: r.UploadedBytes, Chunks: r.Chunks, ChunksUploaded: r.ChunksUploaded,
		DeltaChunks: r.DeltaChunks,
	}
}
